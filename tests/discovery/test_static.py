"""The static backend: the config file's peer list, re-read by reload() (the SIGHUP handler)."""

from __future__ import annotations

import logging

import pytest

from tfscache.discovery import DiscoveryError
from tfscache.discovery.static import StaticDiscovery, peers_from_file

from .conftest import StaticHarness, names, peer


async def test_reload_picks_up_an_edited_file(tmp_path) -> None:
    harness = StaticHarness(tmp_path)
    discovery = harness.make()
    changes = []
    discovery.subscribe(changes.append)
    await discovery.start()
    assert discovery.members() == [peer("a"), peer("b"), peer("c")]
    harness.write(["a", "c", "d"])
    assert await discovery.reload()
    assert discovery.members() == [peer("a"), peer("c"), peer("d")]
    assert [names(c) for c in changes] == [{"a", "b", "c"}, {"a", "c", "d"}]
    assert await discovery.reload()  # unchanged file: no new notification
    assert len(changes) == 2


@pytest.mark.parametrize("content, error", [
    ("[ring\npeers = [", "Expected"),
    ('[ring]\npeers = [{name = "a", grpc = "nohostport"}]\n', "grpc must be HOST:PORT"),
    ('[ring]\npeers = [{name = "a", grpc = "h:1"}, {name = "a", grpc = "h:2"}]\n', "peer names must be unique"),
    ("[ring]\npeers = []\n", "the peer list is empty"),
    ("ring = 3\n", "[ring] must be a table"),
])
async def test_a_bad_file_keeps_the_membership_and_logs_once(tmp_path, caplog, content, error) -> None:
    harness = StaticHarness(tmp_path)
    discovery = harness.make()
    await discovery.start()
    caplog.set_level(logging.INFO, logger="tfscache.discovery")
    harness.config.write_text(content)
    assert not await discovery.reload()
    assert not await discovery.reload()
    assert names(discovery.members()) == {"a", "b", "c"}
    failing = [r for r in caplog.records if "failing" in r.getMessage()]
    assert len(failing) == 1 and error in failing[0].getMessage(), [r.getMessage() for r in caplog.records]
    harness.write(["a", "b"])
    assert await discovery.reload()
    assert names(discovery.members()) == {"a", "b"}
    assert sum("recovered" in r.getMessage() for r in caplog.records) == 1


async def test_a_missing_file_keeps_the_membership(tmp_path) -> None:
    harness = StaticHarness(tmp_path)
    discovery = harness.make()
    await discovery.start()
    harness.config.unlink()
    assert not await discovery.reload()
    assert names(discovery.members()) == {"a", "b", "c"}


async def test_start_without_any_list_fails(tmp_path) -> None:
    with pytest.raises(DiscoveryError, match="no peer list"):
        await StaticDiscovery(config_file=tmp_path / "absent.toml").start()
    with pytest.raises(DiscoveryError, match="no peer list"):
        await StaticDiscovery().start()


async def test_a_fixed_list_needs_no_file() -> None:
    discovery = StaticDiscovery(peers=[peer("b"), peer("a")])
    await discovery.start()
    await discovery.register(peer("a"))
    assert discovery.members() == [peer("a"), peer("b")]
    assert await discovery.reload()  # nothing to re-read: still fine
    await discovery.deregister()
    await discovery.stop()


async def test_an_empty_given_list_is_a_sidecar_alone() -> None:
    discovery = StaticDiscovery(peers=[])
    await discovery.start()  # as `tfscache serve` with no [ring] peers: the ring is this sidecar only
    assert discovery.members() == []


def test_peers_from_file_validates_like_settings(tmp_path) -> None:
    harness = StaticHarness(tmp_path)
    assert peers_from_file(harness.config) == [peer("a"), peer("b"), peer("c")]
