"""deploy/k8s's kustomizations rendered in Python, as ``kubectl kustomize DIR`` renders them.

kubectl is not installed by the test command, so the subset of kustomize that deploy/k8s uses
is done here: ``resources`` (files, or directories with their own kustomization) and
``patches`` whose file is a list of JSON 6902 operations (add, replace, remove) on one
``target`` (kind and name). Anything else in a kustomization.yaml is an error, so a new
feature there fails the tests instead of being silently skipped.

    objects = render(K8S / "consul")     # (kind, name) -> object
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

KNOWN = {"apiVersion", "kind", "resources", "patches"}


def pointer(path: str) -> list[str]:
    """A JSON pointer's tokens (RFC 6901: ~1 is /, ~0 is ~)."""
    if not path.startswith("/"):
        raise ValueError(f"not a JSON pointer: {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _step(target, token: str):
    return target[int(token)] if isinstance(target, list) else target[token]


def apply_ops(obj: dict, ops: list[dict]) -> dict:
    """A copy of ``obj`` with the JSON 6902 ``add``/``replace``/``remove`` operations applied (KeyError,
    IndexError or ValueError when a path does not resolve, as kustomize refuses it)."""
    out = copy.deepcopy(obj)
    for op in ops:
        *parents, last = pointer(op["path"])
        target = out
        for token in parents:
            target = _step(target, token)
        kind = op["op"]
        if kind == "add" and isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), copy.deepcopy(op["value"]))
        elif kind == "add" or (kind == "replace" and isinstance(target, dict) and last in target):
            target[last] = copy.deepcopy(op["value"])
        elif kind == "replace" and isinstance(target, list):
            target[int(last)] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del target[int(last) if isinstance(target, list) else last]
        else:
            raise ValueError(f"cannot apply {op}")
    return out


def kustomization(directory: Path) -> dict:
    return kustomization_data(yaml.safe_load((directory / "kustomization.yaml").read_text()), directory)


def kustomization_data(data: dict, directory: Path) -> dict:
    """``data`` if this module renders everything in it; ValueError otherwise."""
    unknown = set(data) - KNOWN
    if unknown:
        raise ValueError(f"{directory}/kustomization.yaml: {sorted(unknown)} is not rendered by tests/deploy/overlays.py")
    return data


def render(directory: Path) -> dict[tuple[str, str], dict]:
    """(kind, name) -> object for the kustomization in ``directory``."""
    data = kustomization(directory)
    objects: dict[tuple[str, str], dict] = {}
    for resource in data.get("resources", []):
        path = (directory / resource).resolve()
        if path.is_dir():
            objects.update(render(path))
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    for patch in data.get("patches", []):
        key = (patch["target"]["kind"], patch["target"]["name"])
        ops = yaml.safe_load((directory / patch["path"]).read_text())
        if not isinstance(ops, list):
            raise ValueError(f"{patch['path']}: only JSON 6902 patches (a list of operations) are rendered here")
        objects[key] = apply_ops(objects[key], ops)
    return objects


def files(directory: Path) -> tuple[set[str], set[str]]:
    """(resources and patches a kustomization names, the YAML files next to it)."""
    data = kustomization(directory)
    named = {r for r in data.get("resources", []) if not (directory / r).is_dir()}
    named |= {p["path"] for p in data.get("patches", [])}
    present = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
    return named, present
