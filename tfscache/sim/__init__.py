"""The policy simulator's parts: trace reading, the replay engine, and its reports.

``tfscache simulate`` (tfscache/simulate.py) replays a request log through per-node
caches driven by the very policy classes the cache manager uses.
"""

from __future__ import annotations

from tfscache.policy import POLICIES, EvictionPolicy, make_policy
from tfscache.policy.cost import CostAwarePolicy
from tfscache.policy.fifo import FIFOPolicy
from tfscache.policy.lfu import LFUPolicy

# Policies the simulator can build even before they are listed in tfscache.policy.POLICIES.
_LOCAL: dict[str, type[EvictionPolicy]] = {"fifo": FIFOPolicy, "lfu": LFUPolicy, "cost": CostAwarePolicy}


def policy_names() -> list[str]:
    """Every policy the simulator knows, sorted."""
    return sorted(set(POLICIES) | set(_LOCAL))


def build_policy(name: str, max_models: int = 0, memory_bytes: int = 0) -> EvictionPolicy:
    """A new policy by name, as the cache manager builds it, told the node's caps if it asks.

    A policy that weighs how much room a model holds (the cost-aware one) has a
    ``set_caps(max_models, memory_bytes)`` method; it is called here before any load.
    ValueError names the known policies.
    """
    if name in POLICIES:
        policy = make_policy(name)
    elif name in _LOCAL:
        policy = _LOCAL[name]()
    else:
        raise ValueError(f"unknown eviction policy {name!r}; known: {', '.join(policy_names())}")
    set_caps = getattr(policy, "set_caps", None)
    if set_caps is not None:
        set_caps(max_models, memory_bytes)
    return policy
