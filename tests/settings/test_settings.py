"""Settings: defaults < TOML file < TFSCACHE_* environment < CLI flags; bad values name the field."""

from __future__ import annotations

import argparse
import re

import pytest

from tfscache import settings as s
from tfscache.settings import SettingsError


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "models").mkdir()
    return str(tmp_path / "models")


def _from_cli(argv, env=None):
    parser = argparse.ArgumentParser()
    s.add_arguments(parser)
    return s.from_args(parser.parse_args(argv), env or {})


def test_defaults(repo):
    settings = s.load(env={}, overrides={"model_repository": repo})
    assert settings.server.max_receive_message_bytes == settings.server.max_send_message_bytes == 256 << 20
    assert settings.ring.replicas_per_model == 1
    assert settings.node.local_nodes == 1 and not settings.sidecar
    assert (settings.server.grpc_port, settings.server.rest_port) == (8500, 8501)


def test_every_field_has_a_docstring():
    for dotted, f in s.iter_fields():
        assert f.metadata["doc"] and "\n" not in f.metadata["doc"], dotted
    assert "cache.memory_per_node" in s.describe()


@pytest.mark.parametrize("text, expected", [
    ("4GiB", 4 << 30), ("512MiB", 512 << 20), ("1000", 1000), (1000, 1000), ("1.5GB", 1_500_000_000),
    ("2 kib", 2048), ("0", 0),
])
def test_byte_sizes(text, expected):
    assert s.parse_bytes(text) == expected


def test_precedence_file_env_cli(tmp_path, repo):
    config = tmp_path / "tfscache.toml"
    config.write_text(f'model_repository = "{repo}"\n'
                      '[cache]\nmax_models_per_node = 3\nmemory_per_node = "1GiB"\n'
                      '[ring]\nreplicas_per_model = 2\n[server]\ngrpc_port = 9000\n')
    settings = _from_cli(["--config", str(config), "--grpc-port", "9100"],
                         {"TFSCACHE_CACHE_MAX_MODELS_PER_NODE": "5", "TFSCACHE_SERVER_GRPC_PORT": "9050"})
    assert settings.cache.max_models_per_node == 5          # env over file
    assert settings.cache.memory_per_node == 1 << 30        # file
    assert settings.ring.replicas_per_model == 2            # file
    assert settings.server.grpc_port == 9100                # CLI over env
    settings = _from_cli(["--config", str(config), "--memory-per-node", "512MiB", "--set", "cache.policy=lru"])
    assert settings.cache.memory_per_node == 512 << 20


@pytest.mark.parametrize("argv, message", [
    (["--memory-per-node", "4XB"], "bad value for setting cache.memory_per_node: '4XB'"),
    (["--grpc-port", "70000"], "bad value for setting server.grpc_port: '70000'"),
    (["--replicas-per-model", "0"], "bad value for setting ring.replicas_per_model: '0'"),
    (["--local-nodes", "two"], "bad value for setting node.local_nodes: 'two'"),
    (["--node-address", "nohost"], "bad value for setting node.node_address: 'nohost'"),
    (["--set", "cache.nope=1"], "unknown setting in --set: 'cache.nope=1'"),
    (["--routed-requests", "sampled"], "bad value for setting server.routed_requests: 'sampled'"),
    (["--node-connections", "pooled"], "bad value for setting server.node_connections: 'pooled'"),
    (["--data-plane", "haproxy", "--routed-requests", "counted", "--request-log", "/tmp/r.csv"],
     "bad value for setting server.routed_requests: 'counted' (the request log"),
])
def test_bad_values_name_field_and_value(argv, message, repo):
    with pytest.raises(SettingsError) as info:
        _from_cli(["--model-repository", repo, *argv])
    assert str(info.value).startswith(message)


def test_bad_env_and_file_values(tmp_path, repo):
    with pytest.raises(SettingsError, match=r"^bad value for setting ring\.vnodes: 'x'"):
        s.load(env={"TFSCACHE_RING_VNODES": "x", "TFSCACHE_MODEL_REPOSITORY": repo})
    config = tmp_path / "bad.toml"
    config.write_text('[cache]\nmax_model = 3\n')
    with pytest.raises(SettingsError, match=r"^unknown setting cache\.max_model in "):
        s.load(config, env={})
    config.write_text('[server]\nrest_port = "high"\n')
    with pytest.raises(SettingsError, match=r"^bad value for setting server\.rest_port: 'high'"):
        s.load(config, env={})


def test_repository_required_and_must_exist(tmp_path):
    with pytest.raises(SettingsError, match=r"^bad value for setting model_repository: ''"):
        s.load(env={})
    with pytest.raises(SettingsError, match="not a directory"):
        s.load(env={}, overrides={"model_repository": str(tmp_path / "missing")})


@pytest.mark.parametrize("url", ["s3://bucket/models", "gs://bucket", "az://container/a/b"])
def test_a_bucket_url_is_a_repository(url):
    assert s.load(env={}, overrides={"model_repository": url}).model_repository == url


@pytest.mark.parametrize("url, problem", [
    ("ftp://b/p", "unsupported scheme ftp://: expected a directory or one of s3://BUCKET/PREFIX, "
                  "gs://BUCKET/PREFIX, az://CONTAINER/PREFIX"),
    ("az:///models", "must be az://CONTAINER/PREFIX"),
    ("s3://b/p?versionId=3", "must be s3://BUCKET/PREFIX"),
])
def test_a_bad_bucket_url_names_the_form_it_needs(url, problem):
    with pytest.raises(SettingsError) as info:
        s.load(env={}, overrides={"model_repository": url})
    assert str(info.value) == f"bad value for setting model_repository: {url!r} ({problem})"


def test_sidecar_peers(tmp_path, repo):
    config = tmp_path / "peers.toml"
    config.write_text('[ring]\nself_name = "b"\npeers = [\n'
                      '  {name = "a", grpc = "10.0.0.1:8500", rest = "10.0.0.1:8501"},\n'
                      '  {name = "b", grpc = "10.0.0.2:8500"},\n]\n')
    settings = _from_cli(["--config", str(config), "--model-repository", repo,
                          "--node-address", "127.0.0.1:9000,9001"])
    assert settings.sidecar
    assert [p.name for p in settings.ring.peers] == ["a", "b"]
    assert settings.ring.peers[0].rest == "10.0.0.1:8501" and settings.ring.peers[1].rest == ""
    with pytest.raises(SettingsError, match=r"^bad value for setting ring\.self_name: 'c'"):
        _from_cli(["--config", str(config), "--model-repository", repo, "--node-address", "h:1", "--name", "c"])
    env = {"TFSCACHE_RING_PEERS": "a=h1:1/h1:2,b=h2:1", "TFSCACHE_RING_SELF_NAME": "a"}
    settings = _from_cli(["--model-repository", repo, "--node-address", "h:1"], env)
    assert [(p.name, p.grpc, p.rest) for p in settings.ring.peers] == [("a", "h1:1", "h1:2"), ("b", "h2:1", "")]


@pytest.mark.parametrize("address, port", [
    ("127.0.0.1:8500", "8500 is tfscache's own server.grpc_port"),
    ("localhost:9000,8501", "8501 is tfscache's own server.rest_port"),
    ("[::1]:8501", "8501 is tfscache's own server.rest_port"),
])
def test_a_sidecar_node_on_its_own_port_is_refused(address, port, repo):
    # Every load and request would come back to the sidecar itself.
    with pytest.raises(SettingsError, match=rf"^bad value for setting node\.node_address: '{re.escape(address)}' "
                                            rf"\(port {port}"):
        _from_cli(["--model-repository", repo, "--node-address", address, "--name", "a"])
    # Another host's port 8500 is not ours; nor is this host's port 0 (pick a free one).
    assert _from_cli(["--model-repository", repo, "--node-address", "tfserving:8500", "--name", "a"]).sidecar
    assert _from_cli(["--model-repository", repo, "--node-address", address, "--name", "a",
                      "--grpc-port", "0", "--rest-port", "0"]).sidecar


def test_no_join_is_a_switch_that_turns_discovery_join_off(repo, tmp_path):
    assert _from_cli(["--model-repository", repo]).discovery.join is True
    assert _from_cli(["--model-repository", repo, "--no-join"]).discovery.join is False
    assert _from_cli(["--model-repository", repo], {"TFSCACHE_DISCOVERY_JOIN": "false"}).discovery.join is False
    config = tmp_path / "t.toml"
    config.write_text("[discovery]\njoin = false\n")
    assert _from_cli(["--config", str(config), "--model-repository", repo]).discovery.join is False
