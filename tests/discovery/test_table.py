"""Discovery as a table (tfscache/discovery/table.py): a backend is one row, and the settings'
help, their validation and ``from_settings`` all read the rows."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from tfscache import settings as settings_mod
from tfscache.discovery import Discovery, from_settings
from tfscache.discovery.etcd import EtcdDiscovery
from tfscache.discovery.table import BACKENDS, COMMON_OPTIONS, DiscoveryBackend, one_of
from tfscache.importer import import_from_string
from tfscache.settings import SettingsError
from tfscache.settings.sections import DiscoverySection

# A made-up backend: etcd's class under another name, which also requires discovery.dns_name.
ROW = DiscoveryBackend("zone (etcd's class, for this test)",
                       "tfscache.discovery.etcd:EtcdDiscovery",
                       {"service": "service_name", "ttl_s": "ttl_s",
                        "request_timeout_s": "request_timeout_s", "endpoints": "etcd_endpoints",
                        "prefix": "etcd_prefix"},
                       registers=True, required=("dns_name",))


def _load(tmp_path: Path, self_name: str = "", **env: str):
    (tmp_path / "m").mkdir(exist_ok=True)
    base = {"model_repository": str(tmp_path / "m"), "node.node_address": "h:1",
            "ring.self_name": self_name}
    return settings_mod.load(env={f"TFSCACHE_DISCOVERY_{k.upper()}": v for k, v in env.items()},
                             overrides=base)


def test_the_settings_help_and_choices_are_the_rows():
    help_text = DiscoverySection.__dataclass_fields__["backend"].metadata
    assert one_of(["a"]) == "a" and one_of(["a", "b", "c"]) == "a, b or c"
    assert "static (ring.peers, re-read on SIGHUP), consul, etcd or dns" in str(help_text)
    assert list(BACKENDS) == ["static", "consul", "etcd", "dns"]


def test_a_backend_added_as_one_row_is_validated_and_built(tmp_path, monkeypatch):
    pattern = r"discovery.backend: 'zone' \(must be static, consul, etcd or dns\)"
    with pytest.raises(SettingsError, match=pattern):
        _load(tmp_path, backend="zone", dns_name="x")
    monkeypatch.setitem(BACKENDS, "zone", ROW)
    required = r"'' \(required with discovery.backend = zone\)"
    with pytest.raises(SettingsError, match=r"ring.self_name: " + required):
        _load(tmp_path, backend="zone", dns_name="x")
    with pytest.raises(SettingsError, match=r"discovery.dns_name: " + required):
        _load(tmp_path, "a", backend="zone")
    s = _load(tmp_path, "a", backend="zone", dns_name="x", etcd_prefix="/p")
    discovery = from_settings(s)
    assert isinstance(discovery, EtcdDiscovery) and discovery.key_prefix == b"/p/tfscache/"


@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_row_names_real_settings_and_its_class_takes_them(name):
    """A row's options are [discovery] settings (their defaults live there alone) and keywords
    of its class; its class's ``registration_note`` (what ``tfscache join`` answers) is set
    exactly when the row says it registers nothing."""
    row = BACKENDS[name]
    cls = import_from_string(row.factory)
    fields = DiscoverySection.__dataclass_fields__
    options = {**COMMON_OPTIONS, **row.options}
    assert set(options.values()) | set(row.required) <= set(fields)
    assert set(row.options) <= set(inspect.signature(cls.__init__).parameters)
    assert set(COMMON_OPTIONS) <= set(inspect.signature(Discovery.__init__).parameters)
    assert cls.name == name
    assert bool(cls.registration_note) is not row.registers
