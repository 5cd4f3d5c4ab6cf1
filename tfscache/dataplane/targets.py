"""Which local nodes a model's route names: where HAProxy may send its warm requests now.

Deciding only: it reads the router (ring, backends), the copies rule and the nodes' caches, and
returns a ``Target`` or None (no route: the slow path). The control plane grants what it decides
(control.py).

* Copies off (``spread`` None): the node a request would go to alone (``sole_resident``, the
  rule workers' delegations follow).
* Copies on: the model's copies (tfscache.cluster.spread, the router's own view) that hold its
  version AVAILABLE, in ring order; HAProxy balances over them (config.py: the fewest routed
  requests in flight, the first copy on a tie). Every copy must be a local node: a copy on a peer
  sidecar leaves the model on the slow path, which balances over all of them.
  The rule is asked, as for one request now, where it would send one (``Spread.choice``). When
  its pick is not one of those nodes (every copy over its bound and the model hot: an extra
  copy is added; or a copy that does not hold the model yet is under its bound: it loads there),
  there is no route: the next request takes the slow path, where the router picks the same and
  records it. So routed requests never hide a hot model's load from the rule: each poll hands
  their counts to the rule first (tfscache.workers.usage), then asks it.

Sidecar mode: ``peer_target`` says which peer sidecar a model's requests go to when the router
would send them there: its first choice with copies off, the model's one copy with copies on
(a model with copies on several sidecars stays on the slow path, which balances over them).
HAProxy then sends them to that peer's public port, marked as forwarded (config.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tfscache import errors
from tfscache.frontend.backends import NodeBackend, PeerBackend
from tfscache.frontend.methods import RouteKey
from tfscache.workers.usage import Usage, sole_resident


@dataclass(frozen=True)
class Target:
    """The nodes a route names, ties going to the first, and the version they serve."""

    nodes: tuple[NodeBackend, ...]
    version: int


def target(router, usage: Usage, spread, name: str) -> Target | None:
    """Where HAProxy may send ``name``'s warm requests (a request without a version) now; None:
    nowhere, they take the slow path."""
    if spread is None:
        sole = sole_resident(router, usage, name, None)
        return None if sole is None else Target((sole[0],), sole[1])
    try:
        copies, choice = spread.choice(RouteKey(name), router.ring, router.backends,
                                       router.local)
    except errors.TfscacheError:
        return None
    backends = [router.backends.get(node) for node in copies]
    if choice.added or not all(isinstance(b, NodeBackend) for b in backends):
        return None
    serving = {b.name: v for b in backends if (v := _serves(b, name)) is not None}
    version = serving.get(choice.node)
    if version is None:  # the rule's pick does not hold it: a load there, on the slow path
        return None
    return Target(tuple(b for b in backends if serving.get(b.name) == version), version)


def _serves(backend: NodeBackend, name: str) -> int | None:
    """The version a request for ``name`` gets warm on ``backend`` now, if it can take one."""
    cache = backend.cache
    if (cache is None or backend.upstream is None or cache.draining or not cache.healthy
            or not backend.healthy):
        return None
    return cache.resident_version(name)


def peer_target(router, spread, name: str) -> PeerBackend | None:
    """The peer sidecar a request for ``name`` (without a version) would be forwarded to now, if
    HAProxy may send it there itself: the router's first choice with copies off; with copies on,
    the model's only copy, picked by the rule without adding one. None: a local node, several
    copies, an extra copy to add, no peer: the slow path (or a local route) decides."""
    key = RouteKey(name)
    try:
        if spread is None:
            candidates = router.candidates(key)
            first = candidates[0] if candidates else None
        else:
            copies, choice = spread.choice(key, router.ring, router.backends, router.local)
            if choice.added or list(copies) != [choice.node]:
                return None
            first = router.backends.get(choice.node)
            if any(b.healthy and b.holds(key) for b in router.host_tier()):
                return None  # demoted to a host-tier node, which the router tries first
    except errors.TfscacheError:
        return None
    if not isinstance(first, PeerBackend) or not first.healthy:
        return None
    return first
