"""The disk tier's layout on disk and its pure decisions (no I/O except where named).

    ROOT/NAME/VERSION/...                 a complete version, as listed in the bucket
    ROOT/NAME/VERSION/.tfscache-complete  its marker, written last: {"objects": {rel: [size, etag]}}
    ROOT/NAME/FILE                        the model's own files (config.pbtxt, labels.json), replaced
                                          atomically whenever the bucket's copy changed
    ROOT/NAME/.tfscache-complete          a flat model (the tier's ``flat_file`` at the top of
                                          NAME/ in the bucket, no version folder): NAME/ is its
                                          one version, ``FLAT_VERSION``, laid out as in the bucket
    ROOT/.partial/NAME.VERSION.NONCE/     a download in progress (a flat model's:
                                          ``NAME.flat.NONCE``; removed at start-up)
    ROOT/.flat/NAME/FLAT_FILE             a flat model's settings file, copied to read its version's
                                          name before the model is downloaded (removed at start-up)

A version directory without a valid marker, or whose files' sizes differ from it, is
partial and removed at start-up; so is a flat model's directory (one holding ``flat_file``).
Hidden entries (``.partial``, ``.flat``, the marker) are not seen by a node scanning the tier
for settings files (MLServer globs ``**/model-settings.json``, which skips them).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tfscache.errors import FailedPrecondition, UnsafeModelName
from tfscache.storage.base import ObjectInfo

MARKER = ".tfscache-complete"
PARTIAL = ".partial"
FLAT_COPIES = ".flat"
FLAT_VERSION = 0  # a flat model's one version (= tfscache.repository.local.FLAT_VERSION)
Key = tuple[str, int]


@dataclass(frozen=True)
class VersionListing:
    """One version's objects in the bucket: (path relative to the version, size, etag), sorted."""

    objects: tuple[tuple[str, int, str], ...]
    flat: bool = False  # a flat model's one version: its paths are relative to NAME/ itself
    # the version's folder in the bucket when it is not str(version): "00000123", as TF Serving
    # allows (its testdata's half_plus_two); the tier keeps the version as NAME/123 either way
    folder: str = field(default="", compare=False)

    @property
    def bytes(self) -> int:
        return sum(size for _, size, _ in self.objects)

    def manifest(self) -> dict[str, list]:
        return {rel: [size, etag] for rel, size, etag in self.objects}


def check_name(name: str) -> str:
    """``name`` if it is one safe path segment that cannot clash with the tier's own entries."""
    if not name or "/" in name or "\\" in name or "\0" in name or name.startswith("."):
        raise UnsafeModelName(f"unsafe model name {name[:200]!r}")
    return name


def safe_relpath(rel: str, url: str) -> str:
    """``rel`` (an object key below its version) if writing it stays inside the version dir."""
    parts = rel.split("/")
    if (
        rel.startswith("/")
        or "\\" in rel
        or "\0" in rel
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise FailedPrecondition(f"unsafe object key {rel[:200]!r} in {url}: refused")
    if parts[-1] == MARKER:
        raise FailedPrecondition(
            f"object key {rel[:200]!r} in {url} clashes with the tier's marker: refused"
        )
    return rel


def is_flat(name: str, objects: list[ObjectInfo], flat_file: str) -> bool:
    """Whether the listing of ``name/`` is a flat model: ``name/FLAT_FILE`` is in it."""
    return bool(flat_file) and any(obj.key == f"{name}/{flat_file}" for obj in objects)


def group_versions(name: str, objects: list[ObjectInfo],
                   flat_file: str = "") -> dict[int, VersionListing]:
    """The listing of ``name/`` split by numeric version directory; other keys are ignored. A flat
    model (``is_flat``) is one version, ``FLAT_VERSION``: every object under ``name/``."""
    if is_flat(name, objects, flat_file):
        objs = [(obj.key[len(name) + 1:], obj.size, obj.etag) for obj in objects
                if not obj.key.endswith("/")]  # "directory" placeholders hold nothing
        return {FLAT_VERSION: VersionListing(tuple(sorted(objs)), flat=True)}
    found: dict[int, list[tuple[str, int, str]]] = {}
    folders: dict[int, str] = {}
    for obj in objects:
        head, _, rest = obj.key[len(name) + 1:].partition("/")
        if not head.isdigit() or not head.isascii() or not rest or rest.endswith("/"):
            continue  # not NAME/VERSION/FILE, or a "directory" placeholder
        if folders.setdefault(int(head), head) != head:
            continue  # "7" and "007" are one version: the first folder listed is it
        found.setdefault(int(head), []).append((rest, obj.size, obj.etag))
    return {v: VersionListing(tuple(sorted(objs)), folder=folders[v]) for v, objs in found.items()}


def model_files(name: str, objects: list[ObjectInfo],
                flat_file: str = "") -> dict[str, tuple[int, str]]:
    """The model's own files beside its versions (``NAME/config.pbtxt``, ``NAME/labels.json``):
    rel -> (size, etag), for keys one segment below ``name/`` that the tier can hold safely.
    A flat model has none: the files at its top belong to its one version."""
    if is_flat(name, objects, flat_file):
        return {}
    found = {}
    for obj in objects:
        rel = obj.key[len(name) + 1:]
        if (
            rel
            and "/" not in rel
            and "\\" not in rel
            and "\0" not in rel
            and not rel.startswith(".")
            and not rel.isdigit()
        ):
            found[rel] = (obj.size, obj.etag)
    return found


def plan_eviction(resident: dict[Key, int], order: list[Key], keep: set[Key], used: int,
                  need: int, cap: int) -> list[Key] | None:
    """Victims (least recently used first, never one in ``keep``) that make room for ``need`` bytes
    when ``used`` are taken; None if even evicting every version not kept cannot."""
    victims: list[Key] = []
    for key in order:
        if used + need <= cap:
            break
        if key not in keep and key in resident:
            victims.append(key)
            used -= resident[key]
    return victims if used + need <= cap else None


# --- I/O, called in worker threads by the tier ---

def write_marker(directory: Path, listing: VersionListing) -> None:
    """fsync every file, then write the marker (fsynced) last."""
    for rel, _, _ in listing.objects:
        fd = os.open(directory / rel, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    with open(directory / MARKER, "w") as out:
        json.dump({"objects": listing.manifest()}, out)
        out.flush()
        os.fsync(out.fileno())


def read_complete(directory: Path) -> dict[str, list] | None:
    """The marker's manifest if ``directory`` is a complete version (every file's size right)."""
    try:
        manifest = json.loads((directory / MARKER).read_text())["objects"]
        for rel, (size, _) in manifest.items():
            if (directory / rel).stat().st_size != size:
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def scan(root: Path, flat_file: str = "") -> list[tuple[Key, dict[str, list], float, bool]]:
    """Adopt complete versions under ``root`` (key, manifest, marker mtime, flat); remove the rest.
    ``flat_file``: a model directory holding it is a flat model's (``group_versions``)."""
    shutil.rmtree(root / PARTIAL, ignore_errors=True)
    shutil.rmtree(root / FLAT_COPIES, ignore_errors=True)
    adopted = []
    for model in sorted(root.iterdir()) if root.is_dir() else []:
        if model.name.startswith(".") or not model.is_dir():
            continue
        if (model / MARKER).is_file() or (flat_file and (model / flat_file).exists()):
            # a flat model's copy: complete, or removed whole (and by a tier with no flat models)
            manifest = read_complete(model) if flat_file else None
            if manifest is None:
                remove(model)
            else:
                key = (model.name, FLAT_VERSION)
                adopted.append((key, manifest, (model / MARKER).stat().st_mtime, True))
            continue
        for version in sorted(model.iterdir()):
            if not version.name.isdigit() and version.is_file() and not version.is_symlink():
                # the model's own files (config.pbtxt, labels.json): refreshed at each fetch
                continue
            manifest = read_complete(version) if version.name.isdigit() else None
            if manifest is None:
                remove(version)
            else:
                adopted.append(((model.name, int(version.name)), manifest,
                                (version / MARKER).stat().st_mtime, False))
    return adopted


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
