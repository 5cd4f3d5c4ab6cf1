"""Demotion and promotion across nodes: host-tier nodes (docs/tiers.md, "Host-tier nodes").

A node has a tier: ``gpu`` (on the ring, its models on the GPU) or ``host`` (off the ring, the
GPU hidden from it, ``--local-host-nodes``). With ``cache.demote = host`` and a host tier, a
GPU-tier node's victim is not unloaded at once: it is *handed off*, that is loaded on a
host-tier node first (through that node's own cache, its own caps and policy), then routed
there (the router sends a request to a host-tier node that holds a model when no replica on
the ring does), then unloaded from the GPU node once its requests there have ended. A
host-tier node's model whose promotion pays (tfscache.cache.tiers.PromoteRule, fed by its
leases as for a move in place) is handed back the same way to its first healthy node on the
ring. Its requests always have an answer: on the node it leaves until the node it goes to
holds it, then there.

This is how TF Serving and MLServer get the tier, which cannot change a model's devices in
place; Triton gets it too when host-tier nodes are configured.

The cache sees the other nodes only through ``Across``, which the app layer implements over
its topology (tfscache.app.nodes): the cache never calls another cache itself, so a GPU
node's reloader waits for the host-tier node's load (its room is needed), while a
promotion runs in a task of its own and never holds up the host-tier node's reloader (which
the GPU node's own demotions may need meanwhile).
"""

from __future__ import annotations

from typing import Protocol

from tfscache.cache.ledger import Key


class Across(Protocol):
    """The nodes of the other tier, as one cache sees them."""

    def available(self, tier: str) -> bool:
        """Whether a healthy node of ``tier`` (``gpu`` or ``host``) could take a version now."""
        ...

    async def hand_off(self, key: Key, tier: str, timeout: float) -> str:
        """Load ``key`` on a node of ``tier`` (through its cache: loaded there, or already) and
        return that node's name once it holds it. Raises the target's error
        (tfscache.errors.TfscacheError) when it cannot: no such node healthy, no room there
        within ``timeout`` seconds, its load failed."""
        ...
