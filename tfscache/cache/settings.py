"""The caps and timings of one node's cache."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from tfscache.cache.policy import make_policy


@dataclass
class CacheSettings:
    """Caps and timings of one node's cache."""

    max_models: int = 0
    """Most model versions resident on the node at once (0: no cap)."""
    memory_bytes: int = 0
    """Most bytes of models resident on the node at once (0: no cap)."""
    room_timeout_s: float = 30.0
    """How long a load waits for a busy model to become idle before RESOURCE_EXHAUSTED."""
    failure_backoff_s: float = 30.0
    """After a failed load, requests for that version get the same error for this long."""
    rpc_deadline_s: float = 10.0
    """Deadline of GetModelStatus and of reloads that load nothing."""
    reload_deadline_s: float = 300.0
    """Deadline of a reload that loads models; past it the node is marked unhealthy."""
    health_retry_s: float = 5.0
    """While unhealthy, how often to try the node again."""
    estimate_factor: float = 1.2
    """A model's memory before its first load: this times its size on disk (TF Serving's)."""
    policy: str = "lru"
    """Eviction policy, by its name in tfscache.cache.policy.POLICIES."""
    state_file: Path | None = None
    """Where the node's config is kept across restarts (None: not kept; the node is cleared)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"cache setting {f.name} must not be negative, got {value!r}")
        make_policy(self.policy)  # fails early on an unknown name
