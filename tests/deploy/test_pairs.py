"""Each TF Serving container and its sidecar, in docker-compose and in Kubernetes, agree with the code.

The ``pair`` fixture runs every test once per sidecar of deploy/docker-compose.yml and
once for the Kubernetes StatefulSet. The ``*_can_fail`` tests feed each check a broken
copy and expect it to object.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
from packaging.requirements import Requirement

from tfscache import settings as settings_mod

from . import checks, manifests, podchecks


def replace_arg(args: list[str], flag: str, new: str | None) -> list[str]:
    """Args with ``--flag=...`` replaced by ``new`` (or removed when None)."""
    out = [a for a in args if not a.startswith(f"--{flag}=")] + ([new] if new else [])
    assert len(out) != len(args) or new, f"--{flag} not in {args}"
    return out


# -- TF Serving flags ---------------------------------------------------------------------


def test_tfserving_runs_with_the_required_flags(pair):
    assert checks.check_tfserving(pair.tfserving_command, pair.tfserving_args) == []


def test_every_flag_the_doc_requires_is_checked():
    # The doc's table is what check_tfserving enforces; an empty parse would check nothing.
    assert set(manifests.required_tfserving_flags()) >= {"model_config_file", "file_system_poll_wait_seconds",
                                                         "max_num_load_retries", "num_load_threads"}


@pytest.mark.parametrize("flag", manifests.required_tfserving_flags())
def test_flag_check_fails_without_a_required_flag(pair, flag):
    args = replace_arg(pair.tfserving_args, flag, None)
    assert any(f"--{flag} missing" in p for p in checks.check_tfserving(pair.tfserving_command, args))


@pytest.mark.parametrize("flag, bad, why", [
    ("file_system_poll_wait_seconds", "0", "must be >= 1"),
    ("file_system_poll_wait_seconds", "0.5", "must be an integer"),
    ("model_config_file_poll_wait_seconds", "60", "must be 0"),
    ("max_num_load_retries", "5", "must be 0 or 1"),
    ("load_retry_interval_micros", "60000000", "small"),
    ("num_load_threads", "0", "must be >= 2"),
    ("num_unload_threads", "0", "must be >= 1"),
    ("num_load_threads", "four", "Illegal value"),
])
def test_flag_check_fails_on_a_bad_value(pair, flag, bad, why):
    args = replace_arg(pair.tfserving_args, flag, f"--{flag}={bad}")
    problems = checks.check_tfserving(pair.tfserving_command, args)
    assert any(why in p for p in problems), problems


@pytest.mark.parametrize("arg, why", [
    ("--file_system_poll_wait_secs=1", "not a tensorflow_model_server flag"),   # misspelt
    ("--ports_file=/tmp/ports.json", "not a tensorflow_model_server flag"),     # tfscache node only
    ("--num_load_threads 4", "not --flag=value"),
])
def test_flag_check_fails_on_a_flag_tensorflow_model_server_rejects(pair, arg, why):
    problems = checks.check_tfserving(pair.tfserving_command, pair.tfserving_args + [arg])
    assert any(why in p for p in problems), problems


def test_flag_check_fails_when_the_image_entrypoint_script_runs(pair):
    problems = checks.check_tfserving(["/usr/bin/tf_serving_entrypoint.sh"], pair.tfserving_args)
    assert any("tensorflow_model_server itself" in p for p in problems)


def test_tfserving_starts_with_an_empty_model_config_list(pair, tmp_path):
    flags = manifests.tfserving_flags(pair.tfserving_args)
    text = pair.extra["read"](pair.tfserving_mounts, flags["model_config_file"])
    assert text is not None, f"{flags['model_config_file']} is not mounted into TF Serving"
    path = tmp_path / "empty.config"
    path.write_text(text)
    assert checks.check_empty_config(path) == []


@pytest.mark.parametrize("text", ["", 'model_config_list { config { name: "m" base_path: "/models/m" '
                                      'model_platform: "tensorflow" } }'])
def test_empty_config_check_can_fail(tmp_path, text):
    path = tmp_path / "bad.config"
    path.write_text(text)
    assert checks.check_empty_config(path)


def test_tfserving_image_is_the_version_tfscache_targets(pair):
    # tfscache node reproduces tensorflow-serving-api's version: the one constraints.txt installs,
    # within pyproject's node extra.
    version = manifests.pinned_version(manifests.constraints(), "tensorflow-serving-api")
    node_extra = [Requirement(r) for r in manifests.pyproject()["project"]["optional-dependencies"]["node"]]
    assert any(r.name == "tensorflow-serving-api" and version in r.specifier for r in node_extra)
    assert pair.tfserving_image == f"tensorflow/serving:{version}"


# -- the sidecar's settings ---------------------------------------------------------------


def test_sidecar_config_loads_in_sidecar_mode(pair, sidecar_settings):
    assert sidecar_settings.sidecar
    assert sidecar_settings.ring.self_name, "each sidecar needs its ring name"
    assert checks.check_env_names(pair.sidecar_env) == []


def test_sidecar_config_uses_the_default_ports(sidecar_settings):
    # The front ends listen where the manifests publish them: nothing overrides the defaults.
    defaults = settings_mod.Settings()
    for dotted in manifests.sidecar_ports():
        section, name = dotted.split(".")
        assert getattr(getattr(sidecar_settings, section), name) == getattr(getattr(defaults, section), name)


def test_sidecar_config_check_can_fail(pair, tmp_path):
    text = manifests.sidecar_config_text(pair).replace("[cache]", "[cache]\nroom_timeout_s = -1", 1)
    with pytest.raises(settings_mod.SettingsError, match="cache.room_timeout_s"):
        manifests.load_sidecar_settings(text, pair.sidecar_env, tmp_path, tmp_path)
    text = manifests.sidecar_config_text(pair) + "\n[discovery_typo]\nbackend = 'consul'\n"
    with pytest.raises(settings_mod.SettingsError, match="unknown setting"):
        manifests.load_sidecar_settings(text, pair.sidecar_env, tmp_path, tmp_path)


def test_admin_api_and_metrics_are_on_where_the_tools_look(pair, sidecar_settings):
    # `tfscache prewarm` and `tfscache models|drain` reach the admin API, Prometheus and
    # `tfscache status` the metrics port, with the CLIs' defaults inside the sidecar.
    assert checks.check_ops_ports(sidecar_settings, pair.sidecar_env) == []
    assert sidecar_settings.server.admin_port == int(manifests.cli_defaults()["TFSCACHE_ADMIN_ADDRESS"].split(":")[1])


@pytest.mark.parametrize("change, why", [
    ({"admin_port": -1}, "server.admin_port is -1"),
    ({"admin_port": 9502}, "tfscache models/drain in the sidecar call"),
    ({"admin_bind_address": "0.0.0.0", "admin_token": "t"}, "keep the admin API on 127.0.0.1"),
    ({"metrics_port": -1}, "server.metrics_port is -1"),
    ({"metrics_port": 9503}, "tfscache status in the sidecar reads"),
    ({"bind_address": "127.0.0.1"}, "reachable by Prometheus"),
    ({"metrics_port": 8500}, "must differ"),
])
def test_ops_ports_check_can_fail(pair, sidecar_settings, change, why):
    broken = dataclasses.replace(sidecar_settings, server=dataclasses.replace(sidecar_settings.server, **change))
    problems = checks.check_ops_ports(broken, pair.sidecar_env)
    assert any(why in p for p in problems), problems


def test_status_address_env_is_checked(pair, sidecar_settings):
    env = {**pair.sidecar_env, "TFSCACHE_STATUS_ADDRESS": "127.0.0.1:8502"}  # the admin port: wrong
    assert any("tfscache status" in p for p in checks.check_ops_ports(sidecar_settings, env))


def test_env_name_check_can_fail(pair):
    assert checks.check_env_names({**pair.sidecar_env, "TFSCACHE_RING_SELFNAME": "x"})


def test_sidecar_reaches_its_node_on_the_tfserving_ports(pair, sidecar_settings):
    flags = manifests.tfserving_flags(pair.tfserving_args)
    assert checks.check_node_matches(flags, sidecar_settings) == []


def test_node_check_can_fail(pair, sidecar_settings):
    flags = manifests.tfserving_flags(pair.tfserving_args)
    moved = {**flags, "port": str(int(flags["port"]) + 1)}
    assert any("node.node_address" in p for p in checks.check_node_matches(moved, sidecar_settings))
    grpc = manifests.sidecar_ports()["server.grpc_port"]
    clash = {**flags, "port": str(grpc)}
    clashing = dataclasses.replace(sidecar_settings, node=dataclasses.replace(
        sidecar_settings.node, node_address=f"127.0.0.1:{grpc},{flags['rest_api_port']}"))
    assert any("clash" in p for p in checks.check_node_matches(clash, clashing))
    short = dataclasses.replace(sidecar_settings, cache=dataclasses.replace(sidecar_settings.cache,
                                                                           reload_deadline_s=1.0))
    assert any("reload_deadline_s" in p for p in checks.check_node_matches(flags, short))


def test_memory_cap_fits_under_the_tfserving_limit(pair, sidecar_settings):
    assert checks.check_memory(pair, sidecar_settings) == []


def test_memory_check_can_fail(pair, sidecar_settings):
    over = dataclasses.replace(sidecar_settings, cache=dataclasses.replace(
        sidecar_settings.cache, memory_per_node=pair.tfserving_memory_limit))
    assert checks.check_memory(pair, over)
    assert checks.check_memory(dataclasses.replace(pair, tfserving_memory_limit=None), sidecar_settings)


# -- the models: a shared volume, or a bucket through the pod's disk tier -------------------


def repository(pair) -> str:
    return manifests.sidecar_value(pair, "model_repository")


def test_models_reach_tfserving_at_the_sidecars_paths(pair, sidecar_settings):
    if settings_mod.remote_url(repository(pair)):  # a bucket: the sidecar downloads into the disk tier
        storage = sidecar_settings.storage
        assert podchecks.check_disk_tier(pair, storage.cache_dir, storage.cache_bytes) == []
    else:  # a volume both containers mount
        assert checks.check_shared_volume(pair, repository(pair)) == []


def test_the_sidecar_can_write_its_state_and_tier(pair, sidecar_settings):
    if "statefulset" not in pair.extra:
        return  # compose: the sidecar's root file system is writable; nothing to check
    paths = [sidecar_settings.node.state_dir, sidecar_settings.storage.cache_dir]
    assert podchecks.check_writable(pair, paths) == []
    assert podchecks.check_writable(pair, ["/var/lib/elsewhere"])


def test_shared_volume_check_can_fail(pair):
    repo = "/models"
    mounted = {repo: {"source": "models", "read_only": True}}
    pair = dataclasses.replace(pair, tfserving_mounts={**pair.tfserving_mounts, **mounted},
                               sidecar_mounts={**pair.sidecar_mounts, **mounted})
    assert checks.check_shared_volume(pair, repo) == []
    moved = {("/srv" + k if k == repo else k): v for k, v in pair.sidecar_mounts.items()}
    assert checks.check_shared_volume(dataclasses.replace(pair, sidecar_mounts=moved), repo)
    writable = {k: ({**v, "read_only": False} if k == repo else v) for k, v in pair.sidecar_mounts.items()}
    assert checks.check_shared_volume(dataclasses.replace(pair, sidecar_mounts=writable), repo)
    other = {k: ({**v, "source": "elsewhere"} if k == repo else v) for k, v in pair.tfserving_mounts.items()}
    assert checks.check_shared_volume(dataclasses.replace(pair, tfserving_mounts=other), repo)


def test_disk_tier_check_can_fail():
    pair = manifests.deployments()["k8s"][0]
    tier, cap = "/var/cache/tfscache", 40 << 30
    assert podchecks.check_disk_tier(pair, tier, cap) == []
    assert any("must be mounted" in p for p in podchecks.check_disk_tier(pair, "/elsewhere", cap))
    assert any("sizeLimit" in p for p in podchecks.check_disk_tier(pair, tier, 100 << 30))
    swapped = {k: ({**v, "read_only": True} if k == tier else v) for k, v in pair.sidecar_mounts.items()}
    assert any("read-only in TF Serving" in p
               for p in podchecks.check_disk_tier(dataclasses.replace(pair, sidecar_mounts=swapped), tier, cap))
    other = {k: ({**v, "source": "tmp"} if k == tier else v) for k, v in pair.tfserving_mounts.items()}
    assert any("comes from" in p
               for p in podchecks.check_disk_tier(dataclasses.replace(pair, tfserving_mounts=other), tier, cap))


# -- discovery ------------------------------------------------------------------------------


def consul_host(pair) -> str:
    """Compose: the Consul service's name. Kubernetes: the node's Consul agent (HOST_IP)."""
    if "statefulset" in pair.extra:
        return manifests.K8S_EXAMPLE_ENV["status.hostIP"]
    compose = manifests.load_compose()
    return next(n for n, s in compose["services"].items() if s.get("image", "").startswith("hashicorp/consul:"))


def discovery(pair) -> dict:
    return manifests.discovery_section(manifests.sidecar_config_text(pair), pair.sidecar_env)


def test_sidecars_find_each_other(pair):
    # Kubernetes: DNS (the headless Service) by default, Consul in the consul variant; compose: Consul.
    expected = "consul" if pair.name == "k8s-consul" or "statefulset" not in pair.extra else "dns"
    section = discovery(pair)
    assert section["backend"] == expected
    if expected == "dns":
        assert podchecks.check_dns_discovery(section, pair.extra["objects"], pair.sidecar_env) == []
    else:
        assert checks.check_discovery(section, consul_host(pair)) == []


CONSUL_PAIRS = [p for pairs in manifests.deployments().values() for p in pairs if discovery(p)["backend"] == "consul"]


@pytest.mark.parametrize("consul_pair", CONSUL_PAIRS, ids=[p.name for p in CONSUL_PAIRS])
@pytest.mark.parametrize("key, value", [("backend", "static"), ("service_name", "tfs"),
                                        ("consul_address", "http://elsewhere:8500"),
                                        ("consul_address", "consul:8500"), ("advertise_host", "")])
def test_discovery_check_can_fail(consul_pair, key, value):
    assert checks.check_discovery({**discovery(consul_pair), key: value}, consul_host(consul_pair))


@pytest.mark.parametrize("key, value, why", [("backend", "consul", "must be dns"),
                                             ("dns_name", "tfscache.default.svc", "headless Service"),
                                             ("dns_record", "a", "must be srv")])
def test_dns_discovery_check_can_fail(key, value, why):
    pair = manifests.deployments()["k8s"][0]
    problems = podchecks.check_dns_discovery({**discovery(pair), key: value}, pair.extra["objects"],
                                             pair.sidecar_env)
    assert any(why in p for p in problems), problems


@pytest.mark.parametrize("change, why", [
    (lambda o, e: e.update({"TFSCACHE_RING_SELF_NAME": "10.0.0.5"}), "pod name"),
    (lambda o, e: o[("Service", "tfscache-headless")]["spec"].update(publishNotReadyAddresses=True),
     "publishNotReadyAddresses"),
    (lambda o, e: o[("Service", "tfscache-headless")]["spec"]["ports"][0].update(name="grpc-x"), "named grpc"),
])
def test_dns_service_check_can_fail(change, why):
    pair = manifests.deployments()["k8s"][0]
    objects, env = copy.deepcopy(pair.extra["objects"]), dict(pair.sidecar_env)
    change(objects, env)
    problems = podchecks.check_dns_discovery(discovery(pair), objects, env)
    assert any(why in p for p in problems), problems
