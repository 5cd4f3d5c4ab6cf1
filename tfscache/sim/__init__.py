"""The policy simulator's parts: trace reading, the replay engine, and its reports.

``tfscache simulate`` (tfscache/cli/simulate.py) replays a request log through per-node
caches driven by the very policy classes the cache manager uses.
"""

from __future__ import annotations

from tfscache.cache.policy import POLICIES, EvictionPolicy, make_policy, resolve


def policy_names() -> list[str]:
    """Every policy the simulator knows, sorted."""
    return sorted(POLICIES)


def build_policy(name: str, max_models: int = 0, memory_bytes: int = 0) -> EvictionPolicy:
    """A new policy by name, built and told the node's caps exactly as the cache manager does.

    ValueError names the known policies.
    """
    policy = make_policy(resolve(name, memory_bytes))
    policy.set_caps(max_models, memory_bytes)
    return policy
