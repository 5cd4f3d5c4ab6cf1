"""tfscache.workers.delegation alone: grants, revocations that wait for requests in flight, dead
workers, and the races between them, on asyncio events (no process, no sleep)."""

from __future__ import annotations

import asyncio

from tfscache.workers.delegation import Delegations, Grant, Grants

HELD = ("node0", "addk_1", 1)


def grant(asked=("addk_1", 1), held=HELD, expires=None) -> Grant:
    return Grant(asked, held, "127.0.0.1:1", "127.0.0.1:2", expires=expires)


def test_a_granted_key_is_served_warm_and_counted():
    table = Delegations(clock=lambda: 0.0, wall=lambda: 100.0)
    assert table.begin(("addk_1", 1)) is None  # no grant: the cold path
    assert table.want(("addk_1", 1)) and not table.want(("addk_1", 1))  # asked once
    table.add(grant())
    assert not table.want(("addk_1", 1))  # held: nothing to ask
    first, second = table.begin(("addk_1", 1)), table.begin(("addk_1", 1))
    assert first is second and first.in_flight == 2 and not first.idle.is_set()
    assert table.report() == [["node0", "addk_1", 1, 2, 100.0, 2]]
    table.end(first)
    assert table.report() == [["node0", "addk_1", 1, 0, 100.0, 1]]  # counts start again; one still in flight
    table.end(second)
    assert first.idle.is_set()
    assert table.report() == []  # none used or in flight since: the control process counts none in flight


def test_a_refused_key_is_asked_again_by_the_next_cold_request():
    table = Delegations()
    assert table.want(("addk_1", None))
    table.refused(("addk_1", None))
    assert table.want(("addk_1", None))


def test_a_latest_grant_expires():
    now = [0.0]
    table = Delegations(clock=lambda: now[0])
    table.add(grant(asked=("addk_1", None), expires=1.0))
    held = table.begin(("addk_1", None))
    assert held is not None
    table.end(held)
    now[0] = 1.0
    assert table.begin(("addk_1", None)) is None and len(table) == 0


def test_revoke_stops_new_requests_and_waits_for_those_in_flight():
    async def scenario():
        table = Delegations()
        table.add(grant())
        table.add(grant(asked=("addk_1", None)))  # "latest", the same node version
        table.add(grant(asked=("addk_2", 1), held=("node0", "addk_2", 1)))
        running = table.begin(("addk_1", 1))
        gone = table.revoke(HELD)
        assert {g.asked for g in gone} == {("addk_1", 1), ("addk_1", None)}
        assert all(g.revoked for g in gone)
        assert table.begin(("addk_1", 1)) is None and table.begin(("addk_1", None)) is None  # cold from now on
        assert table.begin(("addk_2", 1)) is not None  # another version is untouched
        acked = asyncio.ensure_future(asyncio.gather(*(g.idle.wait() for g in gone)))
        done, _ = await asyncio.wait({acked}, timeout=0.05)
        assert not done  # a request is still in flight: no ack
        table.end(running)
        await asyncio.wait_for(acked, 1.0)

    asyncio.run(scenario())


def test_a_request_dropped_from_its_grant_goes_cold():
    table = Delegations()
    table.add(grant())
    held = table.begin(("addk_1", 1))
    table.drop(held)
    table.end(held)
    assert table.begin(("addk_1", 1)) is None and held.idle.is_set()


def test_control_revocation_waits_for_every_holder_and_forgets_the_grants():
    async def scenario():
        grants = Grants()
        grants.granted(0, HELD)
        grants.granted(1, HELD)
        grants.granted(1, ("node0", "addk_2", 1))
        revocation = grants.revoke(HELD)
        assert revocation.waiting == {0, 1} and grants.holders(HELD) == set()
        grants.acked(0, revocation.id)
        done, _ = await asyncio.wait({asyncio.ensure_future(revocation.done.wait())}, timeout=0.05)
        assert not done  # worker 1 has not acknowledged
        grants.acked(1, revocation.id)
        await asyncio.wait_for(revocation.done.wait(), 1.0)
        assert grants.pending() == [] and grants.held_by(1) == [("node0", "addk_2", 1)]

    asyncio.run(scenario())


def test_a_revocation_nobody_holds_is_done_at_once():
    assert Grants().revoke(HELD).done.is_set()


def test_a_dead_worker_loses_its_grants_and_blocks_no_revocation():
    async def scenario():
        grants = Grants()
        grants.granted(0, HELD)
        grants.granted(1, HELD)
        grants.granted(1, ("node0", "addk_2", 1))
        revocation = grants.revoke(HELD)
        grants.acked(0, revocation.id)
        grants.worker_gone(1)  # it died before acknowledging
        await asyncio.wait_for(revocation.done.wait(), 1.0)
        assert grants.held_by(1) == [] and grants.holders(("node0", "addk_2", 1)) == set()
        later = grants.revoke(("node0", "addk_2", 1))
        assert later.done.is_set()  # nothing it held blocks an unload afterwards

    asyncio.run(scenario())


def test_a_late_or_repeated_ack_changes_nothing():
    grants = Grants()
    grants.granted(0, HELD)
    revocation = grants.revoke(HELD)
    grants.acked(0, revocation.id)
    grants.acked(0, revocation.id)
    grants.acked(3, 999)
    assert revocation.done.is_set() and grants.pending() == []


def test_a_grant_after_a_revocation_is_revoked_by_the_next_one():
    """The grant/revoke race: the channel delivers in order, so a worker applies a grant sent
    before a revoke first; a grant sent after it is recorded again and the next revoke covers it."""
    grants = Grants()
    grants.granted(0, HELD)
    first = grants.revoke(HELD)
    grants.granted(0, HELD)  # granted again once loaded again
    second = grants.revoke(HELD)
    assert first.waiting == {0} and second.waiting == {0} and first.id != second.id
