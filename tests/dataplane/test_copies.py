"""`tfscache serve --data-plane haproxy` with two local nodes and copies that follow load (issue
31): a model with two copies is routed by HAProxy over both; a routed model that turns hot still
gains its extra copy; a copy taken away waits for its request in flight while the other copy
keeps serving; a copy used through HAProxy is kept, and cools down once it is not.

The copies rule runs on the in-flight signal with a bound of one request (``min_load = 1``,
``hot_inflight = 1``, at most two copies), so ``gate`` requests held in flight (they block inside
the node until released at the node) drive it step by step. Its clock is a fake one, for the
cool-down; the background sweep never runs (``sweep_s`` of an hour), the test sweeps itself. The
control plane runs in this test's process (``ServeApp``); the official TF Serving client sends
every request to the public port, HAProxy's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
import pytest_asyncio
from support.models.tfserving import build_gate
from support.node import node_template, version_status_at
from support.gate import Clock, predict_gate, release
from support.dataplane import serving
from support.serving import link_repository
from support.waiting import until

from tfscache import settings as settings_mod
from tfscache.dataplane import binary

pytestmark = [
    pytest.mark.skipif(not binary.available(),
                       reason="haproxy >= 2.6 is not installed (scripts/test.sh installs it)"),
    pytest.mark.asyncio(loop_scope="module"),
]

AVAILABLE = 30
COOL_S = 100.0
# held requests block their client threads: a pool of their own, so the event loop's default
# executor (the control plane's file writes) is never starved by them
CLIENTS = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="gate-client")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("dataplane-copies-repo")
    build_gate(root / "built")
    return link_repository(root / "models", [root / "built" / "gate"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(repo, tmp_path_factory):
    settings = settings_mod.load(None, {}, {
        "model_repository": str(repo), "node.local_nodes": 2, "server.data_plane": "haproxy",
        "server.grpc_port": 0, "server.rest_port": 0, "server.bind_address": "127.0.0.1",
        "node.state_dir": str(tmp_path_factory.mktemp("dataplane-copies") / "state"),
        "node.template_socket": node_template(),
        "copies.signal": "inflight", "copies.min_load": 1.0, "copies.hot_inflight": 1.0,
        "copies.max_copies": 2, "copies.cool_s": COOL_S, "copies.sweep_s": 3600.0})
    async with serving(settings, prepare=_clocked) as app:
        yield app


def _clocked(app) -> None:
    """The copies rule on a clock the test moves."""
    app.clock = Clock()
    app.spread.use_clock(app.clock)


def client(fn, *args) -> asyncio.Future:
    return asyncio.wrap_future(CLIENTS.submit(fn, *args))


def route(app) -> str | None:
    """What routes.map says of gate in force (a node, or a group such as node0+node1)."""
    return app.dataplane.routes.current.get("gate")


async def routed(app) -> dict[str, tuple[int, int]]:
    """node -> (gate's routed requests in flight there, counted there), from HAProxy's table."""
    return {node: (use.in_flight, use.requests)
            for (model, node), use in (await app.dataplane.routes.usage()).items()
            if model == "gate"}


async def in_flight(app, node: str) -> int:
    return (await routed(app)).get(node, (0, 0))[0]


def address(app, node: str) -> str:
    return app.backends[node].upstream.grpc_address


def copies_of(app) -> list[str]:
    return app.spread.copies.copies("gate", app.router.ring.order("gate"))


async def reset(app) -> tuple[str, str]:
    """Nothing held, no extra copy (cooled down on the fake clock), gate resident nowhere; the
    ring order of gate: (its first copy, the node its extra copy goes to)."""
    await until(lambda: _idle(app), 30, "nothing in flight")
    app.clock.now += COOL_S + 1
    await app.spread.sweep()
    for backend in app.backends.values():
        if backend.cache.is_resident("gate", 1):
            await backend.cache.evict("gate", 1)
    await until(lambda: route(app) is None, 30, "gate no longer routed")
    assert len(copies_of(app)) == 1
    first, second = app.router.ring.order("gate")
    return first, second


async def two_copies(app, first: str, second: str) -> list[asyncio.Future]:
    """From ``reset``: gate on its first copy, routed there; two requests held there through
    HAProxy make every copy reach its bound while gate is hot, so the route goes and the next
    request, on the slow path, adds the extra copy and loads gate there (and is held); once
    AVAILABLE on both, gate is routed over both. Returns the three held requests."""
    caches = {node: app.backends[node].cache for node in (first, second)}
    added = app.spread.added.get(second, 0)
    cold = client(predict_gate, app.target)  # the slow path: a load on the first copy
    await until(lambda: caches[first].is_resident("gate", 1), 60, "gate loaded")
    await client(release, address(app, first), 1.0)
    assert await cold == 1.0
    await until(lambda: route(app) == first, 30, "gate routed to its one copy")
    held = []
    for count in (1, 2):  # both routed to the first copy, the route's only node
        held.append(client(predict_gate, app.target))
        await until(lambda c=count: flying(app, first, c), 30, f"{count} held on the first copy")
    # the rule hears of them at the next poll: over the bound, hot, room for a copy: slow path
    await until(lambda: route(app) is None, 30, "gate's route withdrawn for its extra copy")
    assert not caches[second].is_resident("gate", 1) and len(copies_of(app)) == 1
    held.append(client(predict_gate, app.target))  # the slow path adds the copy, loads gate there
    await until(lambda: caches[second].is_resident("gate", 1), 60, "gate loaded on the extra copy")
    assert copies_of(app) == [first, second]
    assert app.spread.added.get(second, 0) == added + 1  # by that request, not by the polls
    await until(lambda: route(app) == f"{first}+{second}", 30, "gate routed over both copies")
    return held


async def flying(app, node: str, count: int) -> bool:
    return await in_flight(app, node) >= count


async def release_all(app, node: str, held: list[asyncio.Future], values: list[float]) -> list:
    for value in values:
        assert await client(release, address(app, node), value) == value
    return [await asyncio.wait_for(request, 60) for request in held]


async def test_a_routed_model_gains_a_copy_and_haproxy_balances_over_both(app):
    first, second = await reset(app)
    before = await routed(app)
    metric = lambda node: app.metrics.counts["tfscache_dataplane_routed"].get(node, 0)
    counted = {node: metric(node) for node in (first, second)}
    held = await two_copies(app, first, second)
    assert await in_flight(app, second) == 0  # the one held there came by the slow path
    used = app.spread.copies.last_used("gate", second)
    app.clock.now += 10
    # HAProxy sends the next request where fewer routed ones are in flight: the extra copy
    held.append(client(predict_gate, app.target))
    await until(lambda: in_flight(app, second), 30, "a routed request held on the extra copy")
    assert await in_flight(app, first) == 2
    # ... and the copies rule heard of it, as of a request it had routed there itself
    await until(lambda: app.spread.copies.last_used("gate", second) == app.clock.now, 10,
                "the extra copy's last use moved by a routed request")
    assert app.clock.now > used
    answers = await release_all(app, first, held[:2], [2.0, 3.0])
    answers += await release_all(app, second, held[2:], [4.0, 5.0])
    assert sorted(answers) == [2.0, 3.0, 4.0, 5.0]  # none failed
    after = await routed(app)
    for node, more in ((first, 2), (second, 1)):  # both nodes' counters rose ...
        assert after[node][1] - before.get(node, (0, 0))[1] >= more
        # ... and /metrics counts each node's own (at the next poll)
        await until(lambda n=node, m=more: metric(n) >= counted[n] + m, 10, f"{node}'s metric")
    await until(lambda: _idle(app), 10, "nothing in flight")


async def _idle(app) -> bool:
    """Nothing in flight, in HAProxy's table and as the copies rule last heard (a request counts
    as used until it ends: the clock moves only after that)."""
    return (all(flying == 0 for flying, _ in (await routed(app)).values())
            and all(app.spread.copies.inflight("gate", node) == 0 for node in app.backends))


async def test_a_copy_taken_away_waits_for_its_request_while_the_other_copy_serves(app):
    first, second = await reset(app)
    held = await two_copies(app, first, second)
    await release_all(app, first, held[:2], [2.0, 3.0])
    await release_all(app, second, held[2:], [4.0])
    await until(lambda: _idle(app), 10, "nothing in flight")
    on_first = client(predict_gate, app.target)  # a tie: the first copy
    await until(lambda: in_flight(app, first), 30, "held on the first copy")
    on_second = client(predict_gate, app.target)  # fewer in flight: the extra copy
    await until(lambda: in_flight(app, second), 30, "held on the extra copy")
    cache = app.backends[second].cache
    evict = asyncio.ensure_future(cache.evict("gate", 1))
    await until(lambda: route(app) == first, 30, "the extra copy out of the route")
    assert cache.state_of("gate", 1) == "unloading"
    # requests keep going to the other copy: this one, routed there, lets the one held there go
    counted = (await routed(app))[first][1]
    assert await client(release, app.target, 7.0) == 7.0
    assert await asyncio.wait_for(on_first, 60) == 7.0
    assert (await routed(app))[first][1] == counted + 1
    assert route(app) == first
    assert not evict.done() and not on_second.done()  # the unload waits for the request ...
    states = [s.state for s in await client(version_status_at, address(app, second), "gate")]
    assert states == [AVAILABLE]  # ... and the node was not told to unload it
    assert await client(release, address(app, second), 8.0) == 8.0
    assert await asyncio.wait_for(on_second, 60) == 8.0  # the held request succeeds
    assert await asyncio.wait_for(evict, 60) == [("gate", 1)]  # then the unload goes ahead
    assert route(app) == first


async def test_a_copy_used_through_haproxy_is_kept_and_cools_down_once_it_is_not(app):
    first, second = await reset(app)
    held = await two_copies(app, first, second)
    await release_all(app, first, held[:2], [2.0, 3.0])
    await release_all(app, second, held[2:], [4.0])
    await until(lambda: _idle(app), 10, "nothing in flight")
    # 60 s on, one request routed to the extra copy (one held on the first sends it there)
    app.clock.now += COOL_S * 0.6
    on_first = client(predict_gate, app.target)
    await until(lambda: in_flight(app, first), 30, "held on the first copy")
    on_second = client(predict_gate, app.target)
    await until(lambda: in_flight(app, second), 30, "held on the extra copy")
    await until(lambda: app.spread.copies.inflight("gate", second), 10,
                "the copies rule told of the request routed to the extra copy")
    await client(release, address(app, second), 5.0)
    await client(release, address(app, first), 6.0)
    assert (await on_first, await on_second) == (6.0, 5.0)
    await until(lambda: _idle(app), 10, "nothing in flight")
    assert app.spread.copies.last_used("gate", second) == app.clock.now  # moved by it
    # 120 s after the copy came, 60 s after its last request: kept, and still routed
    app.clock.now += COOL_S * 0.6
    await app.spread.sweep()
    assert copies_of(app) == [first, second] and route(app) == f"{first}+{second}"
    # idle for cool_s: dropped by the rule; idle as long, so unloaded in the same sweep (through
    # the revocation, which takes it out of the route), and routed to the first copy alone
    app.clock.now += COOL_S
    assert ("gate", second) in await app.spread.sweep()
    assert copies_of(app) == [first]
    assert not app.backends[second].cache.is_resident("gate", 1)
    await until(lambda: route(app) == first, 30, "gate routed to its one copy again")
    counted = (await routed(app))[first][1]
    assert await client(release, app.target, 9.0) == 9.0
    assert await client(predict_gate, app.target) == 9.0
    assert (await routed(app))[first][1] == counted + 2
