"""The model repository: ``ROOT/NAME/VERSION/saved_model.pb``, as TF Serving lays it out.

Every model name is checked to be one safe path segment before it touches the file
system, so nothing outside the repository is ever read. Version directories are
the numeric children of a model's directory, parsed like TF Serving's
``absl::SimpleAtoi`` (``00000123`` is version 123; other names are ignored).

Listing a model's versions is a blocking ``os.scandir``; the newest version of each
model is remembered for ``rescan_s`` seconds, so a hit on ``Latest(NAME)`` costs a
dictionary lookup and a new version on disk is seen within ``rescan_s`` (TF Serving
itself sees one at its next file-system poll).

Version labels live next to the versions, in an optional ``ROOT/NAME/labels.json``
holding one JSON object of label -> version number (``{"stable": 123, "canary": 124}``).
It is read when a request names a label, never at start-up, and remembered for
``rescan_s`` like the newest version (docs/labels.md).

A node kind may also serve *flat* models (``layout``, a ``FlatLayout`` from the kind's row): a
model directory holding the kind's settings file itself, with no version folder, is one version
under the internal key ``FLAT_VERSION``; the node names it by the version name the settings file
gives (``FlatLayout.version_name``), which is then the model's one label. With a layout, a model's
labels are its versions' names as the node knows them (a flat model's name, each version folder's
name), not labels.json; a name it lacks is the layout's ``unknown_version`` error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tfscache import errors

log = logging.getLogger("tfscache.repository.local")

MAX_NAME_BYTES = 255
LABELS_FILE = "labels.json"


def check_name(name: str) -> None:
    """Raise ``UnsafeModelName`` unless ``name`` is one safe path segment."""
    problem = _name_problem(name)
    if problem:  # the name cut short: a 16 KB name must not make a 16 KB message
        shown = repr(errors.shorten(name)) if isinstance(name, str) else repr(name)
        raise errors.UnsafeModelName(f"Invalid model name {shown}: {problem}")


def check_name_length(name: str) -> None:
    """INVALID_ARGUMENT for a name longer than a file name can be (the node's check)."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise errors.InvalidArgument(
            f"Invalid model name {errors.shorten(name)!r}: a model name must be at most "
            f"{MAX_NAME_BYTES} bytes, got {size}")


def _name_problem(name: str) -> str | None:
    if not isinstance(name, str) or not name:
        return "a model name must not be empty"
    if "/" in name or "\0" in name:
        return "a model name must be one path segment (no '/' or NUL)"
    if name in (".", ".."):
        return "a model name must not be '.' or '..'"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "a model name must be valid UTF-8"
    if len(encoded) > MAX_NAME_BYTES:
        return f"a model name must be at most {MAX_NAME_BYTES} bytes, got {len(encoded)}"
    return None


def not_found(name: str, version: int | None, *, model_known: bool = False) -> errors.ModelNotFound:
    """The repository's neutral NOT_FOUND for a model (``version`` None: any version) or a version
    it lacks; ``model_known``: the model has other versions (``VersionNotFound``). Each node kind
    words it as its server would (``NodeAdapter.missing``)."""
    kind = errors.VersionNotFound if model_known else errors.ModelNotFound
    what = f"model {name}" if version is None else f"version {version} of model {name}"
    return kind(f"{what} is not in the model repository", name=name, version=version, neutral=True)


def parse_version(dirname: str) -> int | None:
    """A version directory's number as ``absl::SimpleAtoi`` reads it, or None."""
    text = dirname.strip()
    if text.startswith("+"):
        text = text[1:]
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value < 2**63 else None


def _labels_problem(data: object) -> str | None:
    """Why a parsed labels.json is not an object of label -> version number, or None."""
    if not isinstance(data, dict):
        return "expected a JSON object of label -> version number"
    for label, version in data.items():
        if not label:
            return "a label must not be empty"
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < 2**63:
            return f"label {label!r}: version must be a non-negative integer, got {json.dumps(version)}"
    return None


FLAT_VERSION = 0  # the internal key of a flat model's one version (reached only through its name)


class FlatLayout(Protocol):
    """How a node kind lays out a model without version folders (its row's ``layout``)."""

    settings_file: str  # a model directory holding this file itself is one flat model

    def version_name(self, settings: Path, name: str) -> str:
        """The version name the node gives model ``name``'s flat settings file (blocking: it reads
        it); "" for none. Raises ``FailedPrecondition`` for a file the node would not serve."""

    def unknown_version(self, name: str, version: str) -> errors.TfscacheError:
        """The node's error for a version name model ``name`` lacks (or a model it lacks)."""


@dataclass(frozen=True)
class ModelVersion:
    """One version directory of one model."""

    name: str
    version: int
    path: Path


class ModelRepository:
    """The models under one root directory; reads nothing outside it."""

    def __init__(self, root: str | os.PathLike[str], *, rescan_s: float = 1.0,
                 layout: FlatLayout | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        self.rescan_s = rescan_s
        self.layout = layout  # flat models, for a kind that has them (None: version folders only)
        self._latest: dict[str, tuple[float, int | None]] = {}
        self._labels: dict[str, tuple[float, dict[str, int] | errors.TfscacheError]] = {}

    async def start(self) -> None:
        """Nothing to prepare for a local directory (a bucket's repository adopts its disk tier)."""

    async def stop(self) -> None:
        """Nothing to stop for a local directory (a bucket's repository: its listing refresher)."""

    local = True  # nodes read this directory itself (a bucket's repository: its disk tier)

    async def prepare(self, name: str, version: int) -> None:
        """Make the version's files local before a node loads it (a local directory is already)."""

    def base_path(self, name: str) -> Path:
        """The absolute directory of model ``name`` (which need not exist)."""
        check_name(name)
        return self.root / name

    def versions(self, name: str) -> dict[int, Path]:
        """Version number -> directory for every numeric child of the model's directory."""
        base = self.base_path(name)
        if self.is_flat(name):
            return {FLAT_VERSION: base}
        found: dict[int, Path] = {}
        try:
            with os.scandir(base) as entries:
                for entry in entries:
                    version = parse_version(entry.name)
                    if version is not None and entry.is_dir():
                        # Two spellings of one number ("7", "007"): keep the first, as a listing would.
                        found.setdefault(version, Path(entry.path))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return found

    def is_flat(self, name: str) -> bool:
        """Whether ``name`` is a flat model: its directory holds the layout's settings file."""
        if self.layout is None:
            return False
        return (self.base_path(name) / self.layout.settings_file).is_file()

    def version_name(self, name: str, version: int) -> str:
        """The version's name as the node knows it (blocking for a flat model: its settings file
        is read): a flat model's own (maybe ""), else the number."""
        if version == FLAT_VERSION and self.is_flat(name):
            return self.layout.version_name(self.base_path(name) / self.layout.settings_file, name)
        return str(version)

    def version_of(self, name: str, version_name: str) -> int | None:
        """The key of the version the node calls ``version_name`` (blocking), or None."""
        try:
            if self.is_flat(name):
                named = self.version_name(name, FLAT_VERSION)
                return FLAT_VERSION if named == version_name else None
        except errors.TfscacheError:
            return None
        if version_name.isascii() and version_name.isdigit():
            return int(version_name)
        return None

    def latest_version(self, name: str) -> int | None:
        """The highest version on disk (remembered for ``rescan_s``), or None."""
        now = time.monotonic()
        cached = self._latest.get(name)
        if cached is not None and now - cached[0] < self.rescan_s:
            return cached[1]
        versions = self.versions(name)
        latest = max(versions) if versions else None
        self._latest[name] = (now, latest)
        if len(self._latest) > 100_000:
            self._latest.clear()
        return latest

    def remembered_latest(self, name: str, *, fresh: bool = True) -> int | None:
        """The highest version on disk as last listed, with no file access; None if not known.

        ``fresh``: only while remembered (within ``rescan_s``), as ``latest_version`` would
        answer it. A None sends the cache to list the directory in a worker thread (where
        ``resolve`` checks the name: an unsafe one is never remembered).
        """
        cached = self._latest.get(name)
        if cached is None or (fresh and time.monotonic() - cached[0] >= self.rescan_s):
            return None
        return cached[1]

    def resolve(self, name: str, version: int | None = None) -> ModelVersion:
        """The version to serve for ``(name, version)``; None means the highest on disk.

        Raises ``UnsafeModelName`` or ``ModelNotFound`` with TF Serving's text.
        """
        check_name(name)
        if self.is_flat(name):  # its settings file read: a bad one is its error, not NOT_FOUND
            self.version_name(name, FLAT_VERSION)
        if version is None:
            latest = self.latest_version(name)
            if latest is None:
                raise not_found(name, None)
            path = self.version_path(name, latest)
            if path is None:  # vanished since it was remembered: list again, once
                self._latest.pop(name, None)
                latest = self.latest_version(name)
                path = None if latest is None else self.version_path(name, latest)
                if path is None:
                    raise not_found(name, None)
            return ModelVersion(name, latest, path)
        path = self.version_path(name, version)
        if path is None:
            raise not_found(name, version, model_known=self.latest_version(name) is not None)
        return ModelVersion(name, version, path)

    async def refresh_labels(self, name: str) -> None:
        """Read the model's labels.json in a worker thread unless remembered within ``rescan_s``,
        so that ``label_version`` (with ``max_age``) then answers without touching the disk."""
        check_name(name)
        cached = self._labels.get(name)
        if cached is None or time.monotonic() - cached[0] >= self.rescan_s:
            labels = await asyncio.to_thread(self._read_labels, name)
            self._labels[name] = (time.monotonic(), labels)
            if len(self._labels) > 100_000:
                self._labels.clear()

    def label_version(self, name: str, label: str, *, max_age: float | None = None) -> int:
        """The version ``label`` names in the model's labels.json, as TF Serving resolves a label.

        Raises ``InvalidArgument`` with TF Serving's "Unrecognized servable version label: L"
        for a label the file does not define (or a model with no file), and ``InvalidArgument``
        naming the file when it is not a JSON object of label -> version number. Whether the
        version exists is not checked here: loading it gives TF's ``Specific(NAME, V)`` NOT_FOUND.
        ``max_age``: how old a remembered reading may be (default ``rescan_s``).
        """
        check_name(name)
        now = time.monotonic()
        cached = self._labels.get(name)
        if cached is None or now - cached[0] >= (self.rescan_s if max_age is None else max_age):
            cached = self._labels[name] = (now, self._read_labels(name))
            if len(self._labels) > 100_000:
                self._labels.clear()
        labels = cached[1]
        if isinstance(labels, errors.TfscacheError):
            raise labels
        version = labels.get(label)
        if version is None:
            if self.layout is not None:
                raise self.layout.unknown_version(name, label)
            raise errors.InvalidArgument(f"Unrecognized servable version label: {label}")
        return version

    def _version_names(self, name: str) -> dict[str, int]:
        """With a layout: each version's name as the node knows it -> its key (blocking)."""
        if self.is_flat(name):
            named = self.version_name(name, FLAT_VERSION)
            return {named: FLAT_VERSION} if named else {}
        return {path.name: v for v, path in self.versions(name).items()} | {
            str(v): v for v in self.versions(name)}

    def _read_labels(self, name: str) -> dict[str, int] | errors.TfscacheError:
        if self.layout is not None:
            try:
                return self._version_names(name)
            except errors.TfscacheError as exc:
                return exc
        path = self.root / name / LABELS_FILE
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            return errors.InvalidArgument(f"Cannot read version labels file {path}: {exc}")
        try:
            data = json.loads(text)
        except ValueError as exc:
            return errors.InvalidArgument(f"Malformed version labels file {path}: {exc}")
        problem = _labels_problem(data)
        if problem:
            return errors.InvalidArgument(f"Malformed version labels file {path}: {problem}")
        return data

    def version_path(self, name: str, version: int) -> Path | None:
        """The directory of one version, or None when it is not on disk."""
        base = self.base_path(name)
        plain = base / str(version)
        if plain.is_dir():
            return plain
        return self.versions(name).get(version)

    def vanished(self, keys) -> list[tuple[str, int]]:
        """Which of ``keys`` (name, version) are no longer in the repository (blocking: a stat each)."""
        return [k for k in keys if self.version_path(*k) is None]

    def exists(self, name: str) -> bool:
        """Whether the model's directory exists (a missing base_path wedges TF Serving)."""
        return self.base_path(name).is_dir()

    def disk_bytes(self, name: str, version: int) -> int:
        """Sum of the sizes of all files under the version directory (symlinks not followed)."""
        path = self.version_path(name, version)
        if path is None:
            raise not_found(name, version)
        total = 0
        for dirpath, _dirnames, filenames in os.walk(path, followlinks=False):
            for filename in filenames:
                try:
                    st = os.lstat(os.path.join(dirpath, filename))
                except OSError:
                    continue
                total += st.st_size
        return total
