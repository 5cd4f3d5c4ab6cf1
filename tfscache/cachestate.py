"""The cache manager's state file: what its node's config holds, so a restart can re-adopt it.

JSON, written atomically (PATH.tmp, then rename) after every change to the node's
config. A missing or unreadable file reads as empty: the manager then clears the node.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger("tfscache.cachestate")

FORMAT = 1


@dataclass
class SavedModel:
    """One model version in the node's config when the state was saved."""

    name: str
    version: int
    bytes: int
    measured: bool
    last_use: float  # wall-clock seconds
    pinned: bool = False  # an admin pin: adopted pinned, or loaded and pinned again after a restart


@dataclass
class CacheState:
    node: str = ""
    models: list[SavedModel] = field(default_factory=list)
    # (name, version) -> bytes measured on an earlier load, kept across evictions.
    learned: dict[str, int] = field(default_factory=dict)


def learned_key(name: str, version: int) -> str:
    return f"{version}:{name}"


def load_state(path: Path | None) -> CacheState:
    if path is None:
        return CacheState()
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown format {data.get('format')!r}")
        return CacheState(
            node=str(data.get("node", "")),
            models=[SavedModel(str(m["name"]), int(m["version"]), int(m["bytes"]),
                               bool(m["measured"]), float(m["last_use"]), bool(m.get("pinned", False)))
                    for m in data["models"]],
            learned={str(k): int(v) for k, v in data.get("learned", {}).items()},
        )
    except FileNotFoundError:
        return CacheState()
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring unreadable cache state file %s: %s", path, e)
        return CacheState()


def save_state(path: Path | None, state: CacheState) -> None:
    """Write ``state`` atomically. A small synchronous write, on purpose: it is a few KB."""
    if path is None:
        return
    path = Path(path)
    data = {"format": FORMAT, "node": state.node,
            "models": [asdict(m) for m in state.models], "learned": state.learned}
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        os.replace(tmp, path)
    except OSError as e:
        log.error("cannot write cache state file %s: %s", path, e)
