"""Tiers of residency and what moving between them costs: pure rules, no node, no clock.

A model version is resident on the GPU, resident in host memory (loaded on CPU instances, or
on a host-tier node: it still answers, more slowly), or only on disk (the disk tier or the
repository). ``cache.demote`` says what happens to a GPU victim: ``none`` (it is unloaded, and
its next request is a cold load) or ``host`` (it moves to host memory, and its next request is
answered from there at once). A victim of the host tier is unloaded.

What each move costs, per version (``TierCosts``): a cold load from disk (``load_s``), a
promotion from host memory to the GPU (``promote_s``), and a request's service time on each
tier. Two rules use them:

* **which tier prices an eviction** (``eviction_cost``): the eviction policies weigh a
  model's worth as frequency x cost / room (GDSF). On the GPU tier with demotion on, what
  evicting a model costs is a promotion (it comes back from host memory); with demotion off,
  a cold load. On the host tier it is what a drop loses against a promotion: ``load_s -
  promote_s``. So the host tier keeps first the models that are dear to load from disk and
  cheap to promote, and a model that loads from disk about as fast as it promotes is not
  worth host memory (``demote_pays``: it is dropped instead).
* **when a demoted model goes back to the GPU** (``PromoteRule.pays``): at once when requests
  queue behind it (``queue`` or more waiting), else when the service time its requests would
  save on the GPU over ``horizon_s`` seconds, at its present rate (``Rates``), is at least the
  promotion's own time: ``rate x (host_service_s - gpu_service_s) x horizon_s >= promote_s``.
  A model requested once an hour stays in host memory; one requested every second is
  promoted on its first request from there once that pays.

``tfscache simulate --tiers`` replays request logs through these rules (tfscache/sim/tiers.py).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

GPU, HOST, DISK = "gpu", "host", "disk"
DEMOTE_MODES = ("none", "host")


@dataclass(frozen=True)
class TierCosts:
    """One version's costs, in seconds: a cold load, a promotion from host memory, a
    request's service on the GPU and in host memory."""

    load_s: float
    promote_s: float
    gpu_service_s: float
    host_service_s: float

    def __post_init__(self) -> None:
        for name in ("load_s", "promote_s", "gpu_service_s", "host_service_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def eviction_cost(costs: TierCosts, tier: str, demote: str) -> float:
    """What evicting a version from ``tier`` costs when it is requested again (the ``C`` of
    GDSF): see the module docstring."""
    if tier == GPU:
        return costs.promote_s if demote == HOST else costs.load_s
    if tier == HOST:
        return max(costs.load_s - costs.promote_s, 0.0)
    raise ValueError(f"no eviction from tier {tier!r}")


def demote_pays(costs: TierCosts) -> bool:
    """Whether host memory saves anything for this version: its promotion is faster than its
    cold load."""
    return costs.promote_s < costs.load_s


@dataclass(frozen=True)
class PromoteRule:
    """When a version answered from host memory goes back to the GPU (module docstring)."""

    horizon_s: float = 60.0
    queue: int = 4

    def __post_init__(self) -> None:
        if not self.horizon_s > 0 or self.queue < 1:
            raise ValueError(
                f"horizon_s must be > 0 and queue >= 1, got {self.horizon_s!r}, {self.queue!r}"
            )

    def pays(self, rate_hz: float, queued: int, costs: TierCosts) -> bool:
        if queued >= self.queue:
            return True
        slower = costs.host_service_s - costs.gpu_service_s
        return slower > 0 and rate_hz * slower * self.horizon_s >= costs.promote_s


class Rates:
    """Each key's request rate, exponentially decayed with time constant ``tau_s``: O(1) per
    request, and a key not requested for a few ``tau_s`` falls to about 0.

    After requests every ``d`` seconds for long enough, the rate reads ``1 / d`` (for ``d``
    well under ``tau_s``).
    """

    def __init__(self, tau_s: float = 60.0) -> None:
        if not tau_s > 0:
            raise ValueError(f"tau_s must be > 0, got {tau_s!r}")
        self.tau_s = tau_s
        self._rates: dict[Hashable, tuple[float, float]] = {}  # key -> (rate, when)

    def request(self, key: Hashable, now: float) -> float:
        """Count a request of ``key`` at ``now`` (seconds, never decreasing); its rate after it."""
        rate = self.at(key, now) + 1.0 / self.tau_s
        self._rates[key] = (rate, now)
        return rate

    def at(self, key: Hashable, now: float) -> float:
        """``key``'s rate at ``now``, in requests per second (0 for one never requested)."""
        rate, when = self._rates.get(key, (0.0, now))
        return rate * math.exp(-max(now - when, 0.0) / self.tau_s)

    def forget(self, key: Hashable) -> None:
        self._rates.pop(key, None)
