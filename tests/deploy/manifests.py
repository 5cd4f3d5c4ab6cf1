"""Reading deploy/ (Dockerfile, docker-compose.yml, Kubernetes manifests) and checking it against the code.

Docker cannot run on the build machines, so the manifests are parsed, not run. Each
``check_*`` function returns a list of problems (empty when the manifest agrees with the
code), so the tests can show that every check fails on a broken copy of a manifest.

Expected values come from the code, never from a literal here:

* ports: the defaults of ``tfscache.settings`` (every ``*port`` setting with a default > 0);
* TF Serving flags: the table in docs/real-tfserving.md and the flag table ``FLAGS`` of
  ``tfscache.node.main`` (tensorflow_model_server's names and types);
* sidecar configs: loaded with ``tfscache.settings.load``.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tfscache import settings as settings_mod

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"

# The discovery settings agreed with the engineer adding them to tfscache/settings.py
# (issue 5). Used only while settings.py has no [discovery] section; once it has one,
# the manifests are checked against the real names instead.
PLANNED_DISCOVERY = {"backend", "consul_address", "service_name", "advertise_host"}
# Consul's own default HTTP API port (the agent listens there in the hashicorp/consul image).
CONSUL_HTTP_PORT = 8500
# Flags `tfscache node` accepts that tensorflow_model_server does not (tfscache/node/main.py
# docstring and docs/DESIGN.md); the real binary would refuse them.
TFSCACHE_NODE_EXTENSIONS = {"bind_address", "ports_file", "load_gate_dir"}


# -- the code's side ------------------------------------------------------------------------


def sidecar_ports() -> dict[str, int]:
    """Every listening-port setting with a fixed default: dotted name -> port."""
    ports = {}
    for dotted, f in settings_mod.iter_fields():
        default = f.default
        if dotted.rsplit(".", 1)[-1].endswith("port") and isinstance(default, int) and default > 0:
            ports[dotted] = default
    return ports


def known_settings() -> set[str]:
    """Dotted names of every setting, plus the planned discovery ones while settings.py lacks them."""
    names = {dotted for dotted, _ in settings_mod.iter_fields()}
    if not discovery_landed():
        names |= {f"discovery.{name}" for name in PLANNED_DISCOVERY}
    return names


def discovery_landed() -> bool:
    return any(dotted.startswith("discovery.") for dotted, _ in settings_mod.iter_fields())


def env_name(dotted: str) -> str:
    return "TFSCACHE_" + dotted.replace(".", "_").upper()


def required_tfserving_flags() -> list[str]:
    """The flags in docs/real-tfserving.md's "Why each flag" table, in order."""
    text = (ROOT / "docs" / "real-tfserving.md").read_text()
    section = text.split("## Why each flag", 1)[1].split("\n## ", 1)[0]
    flags = re.findall(r"^\|\s*`--([a-z_]+)`", section, flags=re.M)
    assert flags, "no flag table found in docs/real-tfserving.md"
    return flags


def node_flags():
    from tfscache.node import main as node_main  # no tensorflow at import time

    return node_main


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pinned_version(requirements: list[str], package: str) -> str | None:
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    return None


# -- Dockerfile -----------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    args: str

    def exec_form(self) -> list[str] | None:
        try:
            value = json.loads(self.args)
        except ValueError:
            return None
        return value if isinstance(value, list) else None


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue  # comments inside a continued instruction are removed by Docker
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    return instructions


def dockerignore_allows(patterns: list[str], path: str) -> bool:
    """Whether a context path is sent to the builder (last matching pattern wins; ``!`` re-includes)."""
    allowed = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern[1:] if negate else pattern
        pattern = pattern.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            allowed = negate
    return allowed


def check_dockerfile(text: str, ignore_text: str) -> list[str]:
    problems = []
    instructions = parse_dockerfile(text)
    by_kw: dict[str, list[Instruction]] = {}
    for ins in instructions:
        by_kw.setdefault(ins.keyword, []).append(ins)
    froms = by_kw.get("FROM", [])
    if len(froms) != 1 or froms[0].args.split()[0] != "python:3.11-slim":
        problems.append(f"base image must be python:3.11-slim, got {[f.args for f in froms]}")
    exposed = {int(p.split("/")[0]) for ins in by_kw.get("EXPOSE", []) for p in ins.args.split()}
    if exposed != set(sidecar_ports().values()):
        problems.append(f"EXPOSE {sorted(exposed)} != the settings' default ports {sidecar_ports()}")
    installs = [ins.args for ins in by_kw.get("RUN", []) if re.search(r"\bpip\b.*\binstall\b", ins.args)]
    if not installs:
        problems.append("no pip install of tfscache")
    for run in installs:
        for command in run.split("&&"):
            words = shlex.split(command)
            if "pip" not in words or "install" not in words:
                continue
            targets = [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
            if targets != ["."]:
                problems.append(f"pip must install the project alone, without extras: {command.strip()!r}")
            if any("tensorflow" in w for w in words):
                problems.append(f"the sidecar image must not install tensorflow: {command.strip()!r}")
    base_deps = pyproject()["project"]["dependencies"]
    if any(d.lower().startswith("tensorflow") for d in base_deps):
        problems.append(f"pyproject's base dependencies pull tensorflow: {base_deps}")
    users = by_kw.get("USER", [])
    if not users or users[-1].args.split(":")[0] in ("root", "0"):
        problems.append(f"the image must run as a non-root user, USER = {[u.args for u in users]}")
    entry = by_kw.get("ENTRYPOINT", [Instruction("ENTRYPOINT", "")])[-1].exec_form()
    if entry != ["tfscache", "serve"]:
        problems.append(f"ENTRYPOINT must be [\"tfscache\", \"serve\"], got {entry}")
    patterns = [line.strip() for line in ignore_text.splitlines() if line.strip() and not line.startswith("#")]
    for ins in by_kw.get("COPY", []):
        for source in ins.args.split()[:-1]:
            if not source.startswith("--") and not dockerignore_allows(patterns, source.rstrip("/")):
                problems.append(f"COPY {source}: excluded from the build context by Dockerfile.dockerignore")
    return problems


def dockerfile_default_config(text: str) -> tuple[Path, list[str]]:
    """(the config file baked into the image, the CMD) from ``COPY deploy/X /etc/...`` and CMD."""
    instructions = parse_dockerfile(text)
    cmd = next(i for i in reversed(instructions) if i.keyword == "CMD").exec_form()
    config_path = cmd[cmd.index("--config") + 1]
    for ins in instructions:
        if ins.keyword == "COPY" and ins.args.split()[-1] == config_path:
            return ROOT / ins.args.split()[0], cmd
    raise AssertionError(f"no COPY puts a file at {config_path}")


# -- sidecar settings -----------------------------------------------------------------------


def _without_table(toml_text: str, table: str) -> str:
    out, skipping = [], False
    for line in toml_text.splitlines():
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            skipping = header.group(1).strip() == table
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def load_sidecar_settings(toml_text: str, env: Mapping[str, str], tmp_path: Path,
                          model_repository: Path) -> settings_mod.Settings:
    """The settings a sidecar starts with: its TOML plus its TFSCACHE_* environment.

    ``model_repository`` stands in for the mounted volume (settings.load checks it is a
    directory); the TOML's own value is checked against the mounts separately. While
    settings.py has no discovery section, the [discovery] table and TFSCACHE_DISCOVERY_*
    variables are checked against the planned names and left out of the load.
    """
    data = tomllib.loads(toml_text)
    env = dict(env)
    if not discovery_landed():
        unknown = set(data.get("discovery", {})) - PLANNED_DISCOVERY
        if unknown:
            raise settings_mod.SettingsError(f"unknown setting(s) discovery.{sorted(unknown)}")
        toml_text = _without_table(toml_text, "discovery")
        env = {k: v for k, v in env.items() if not k.startswith("TFSCACHE_DISCOVERY_")}
    config = tmp_path / "tfscache.toml"
    config.write_text(toml_text)
    return settings_mod.load(config, env=env, overrides={"model_repository": str(model_repository)})


def discovery_section(toml_text: str, env: Mapping[str, str]) -> dict[str, str]:
    """[discovery] with TFSCACHE_DISCOVERY_* from the environment applied on top."""
    section = dict(tomllib.loads(toml_text).get("discovery", {}))
    for name in known_settings():
        if name.startswith("discovery.") and env_name(name) in env:
            section[name.split(".", 1)[1]] = env[env_name(name)]
    return section


def check_env_names(env: Mapping[str, str]) -> list[str]:
    """Every TFSCACHE_* variable names a setting (settings.load silently ignores others)."""
    known = {env_name(d) for d in known_settings()} | {"TFSCACHE_LOG_LEVEL"}
    return [f"{key} is not a tfscache setting (settings.py knows {sorted(known)})"
            for key in env if key.startswith("TFSCACHE_") and key not in known]


def node_ports(settings: settings_mod.Settings) -> tuple[str, int, int | None]:
    host_port, _, rest = settings.node.node_address.partition(",")
    host, _, port = host_port.rpartition(":")
    return host, int(port), int(rest) if rest else None


# -- TF Serving command lines ---------------------------------------------------------------


def parse_flag_args(args: list[str]) -> dict[str, str]:
    flags = {}
    for arg in args:
        match = re.fullmatch(r"--([A-Za-z0-9_]+)=(.*)", arg)
        if not match:
            raise ValueError(f"not --flag=value: {arg!r}")
        flags[match.group(1)] = match.group(2)
    return flags


def check_tfserving(command: list[str], args: list[str]) -> list[str]:
    """The node runs tensorflow_model_server with the flags docs/real-tfserving.md requires."""
    problems = []
    if command != ["tensorflow_model_server"]:
        problems.append(f"run tensorflow_model_server itself (not the image's entrypoint script), got {command}")
    try:
        flags = parse_flag_args(args)
    except ValueError as exc:
        return problems + [str(exc)]
    node_main = node_flags()
    for name in flags:
        if name not in node_main.FLAGS or name in TFSCACHE_NODE_EXTENSIONS:
            problems.append(f"--{name} is not a tensorflow_model_server flag")
    try:  # the same parser and types as tensorflow_model_server's flags (tfscache node's table)
        node_main.parse_flags([f"--{k}={v}" for k, v in flags.items() if k in node_main.FLAGS])
    except node_main.FlagError as exc:
        problems.append(str(exc))
        return problems
    for name in required_tfserving_flags():
        if name not in flags:
            problems.append(f"--{name} missing (docs/real-tfserving.md requires it)")
    if problems:
        return problems

    def integer(name: str) -> int | None:
        if not re.fullmatch(r"-?\d+", flags[name]):
            problems.append(f"--{name}={flags[name]} must be an integer for tensorflow_model_server")
            return None
        return int(flags[name])

    rules = {
        "model_config_file_poll_wait_seconds": (lambda v: v == 0, "must be 0: a poll overwrites the sidecar's config"),
        "file_system_poll_wait_seconds": (lambda v: v >= 1, "must be >= 1 (0 makes reloads hang)"),
        "max_num_load_retries": (lambda v: 0 <= v <= 1, "must be 0 or 1"),
        "num_load_threads": (lambda v: v >= 2, "must be >= 2"),
        "num_unload_threads": (lambda v: v >= 1, "must be >= 1"),
        "load_retry_interval_micros": (lambda v: v <= 1_000_000, "must be small (<= 1 s)"),
    }
    for name, (ok, why) in rules.items():
        value = integer(name)
        if value is not None and not ok(value):
            problems.append(f"--{name}={value}: {why}")
    return problems


def tfserving_flags(args: list[str]) -> dict[str, str]:
    return parse_flag_args(args)


def check_node_matches(flags: Mapping[str, str], sidecar: settings_mod.Settings) -> list[str]:
    """The sidecar's node.node_address and deadlines fit the TF Serving flags next to it."""
    problems = []
    host, grpc, rest = node_ports(sidecar)
    if host not in ("127.0.0.1", "localhost"):
        problems.append(f"node.node_address {sidecar.node.node_address!r}: the node shares the sidecar's "
                        "network namespace, use 127.0.0.1")
    if str(grpc) != flags.get("port") or str(rest) != flags.get("rest_api_port"):
        problems.append(f"node.node_address {sidecar.node.node_address!r} != TF Serving's "
                        f"--port={flags.get('port')} --rest_api_port={flags.get('rest_api_port')}")
    clash = {grpc, rest} & set(sidecar_ports().values())
    if clash:
        problems.append(f"TF Serving's ports {sorted(clash)} clash with the sidecar's own ports in the "
                        "shared network namespace")
    worst = (int(flags["file_system_poll_wait_seconds"])
             + int(flags["max_num_load_retries"]) * int(flags["load_retry_interval_micros"]) / 1e6)
    if sidecar.cache.reload_deadline_s <= worst:
        problems.append(f"cache.reload_deadline_s={sidecar.cache.reload_deadline_s} must exceed one poll plus "
                        f"the retries ({worst} s) plus the slowest load")
    return problems


def check_empty_config(path: Path) -> list[str]:
    """TF Serving's --model_config_file holds an empty model_config_list, not nothing."""
    from tfscache.node.config import parse_model_server_config

    config = parse_model_server_config(path.read_text())
    if config.WhichOneof("config") != "model_config_list" or len(config.model_config_list.config):
        return [f"{path.name} must hold exactly `model_config_list {{}}` (tfserving-behavior.md §1.9)"]
    return []


def check_discovery(section: Mapping[str, str], consul_host: str | None) -> list[str]:
    problems = []
    if section.get("backend") != "consul":
        problems.append(f"discovery.backend must be consul, got {section.get('backend')!r}")
    if section.get("service_name") != "tfscache":
        problems.append(f"discovery.service_name must be tfscache, got {section.get('service_name')!r}")
    match = re.fullmatch(r"https?://([^/:]+):(\d+)/?", section.get("consul_address", ""))
    if not match:
        problems.append(f"discovery.consul_address must be http://HOST:PORT, got {section.get('consul_address')!r}")
    elif (consul_host is not None and match.group(1) != consul_host) or int(match.group(2)) != CONSUL_HTTP_PORT:
        problems.append(f"discovery.consul_address {section['consul_address']!r} is not the Consul agent "
                        f"({consul_host}:{CONSUL_HTTP_PORT})")
    if not section.get("advertise_host"):
        problems.append("discovery.advertise_host must be set: other sidecars forward to it")
    return problems


# -- docker-compose -------------------------------------------------------------------------


def load_compose(text: str | None = None) -> dict:
    return yaml.safe_load(COMPOSE.read_text() if text is None else text)


def compose_mounts(service: Mapping) -> dict[str, dict]:
    """target -> {source, read_only} for every volume of a service (long or short syntax)."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            volume = {"source": source, "target": target, "read_only": "ro" in mode}
        mounts[volume["target"]] = {"source": volume["source"], "read_only": bool(volume.get("read_only"))}
    return mounts


def compose_source(source: str) -> Path | None:
    """A bind-mount source relative to deploy/ (None when it comes from a variable)."""
    if "$" in source:
        return None
    return (DEPLOY / source).resolve()


def as_list(value) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else list(value)


@dataclass
class Pair:
    """A TF Serving node and its sidecar, from either deployment."""

    name: str
    tfserving_image: str
    tfserving_command: list[str]
    tfserving_args: list[str]
    tfserving_mounts: dict[str, dict]
    sidecar_mounts: dict[str, dict]
    sidecar_args: list[str]
    sidecar_env: dict[str, str]
    tfserving_memory_limit: int | None
    extra: dict = field(default_factory=dict)


def compose_pairs(compose: Mapping) -> list[Pair]:
    services = compose["services"]
    pairs = []
    for name, sidecar in services.items():
        mode = sidecar.get("network_mode", "")
        if not mode.startswith("service:"):
            continue
        node_name = mode.split(":", 1)[1]
        node = services.get(node_name)
        if node is None:
            continue  # check_compose reports it
        pairs.append(Pair(
            name=name, tfserving_image=node.get("image", ""),
            tfserving_command=as_list(node.get("entrypoint")), tfserving_args=as_list(node.get("command")),
            tfserving_mounts=compose_mounts(node), sidecar_mounts=compose_mounts(sidecar),
            sidecar_args=as_list(sidecar.get("command")),
            sidecar_env={k: str(v) for k, v in (sidecar.get("environment") or {}).items()},
            tfserving_memory_limit=settings_mod.parse_bytes(node["mem_limit"].upper() + "iB")
            if node.get("mem_limit") else None,
            extra={"node_service": node_name, "sidecar": sidecar, "node": node}))
    return pairs


def check_compose(compose: Mapping) -> list[str]:
    problems = []
    services = compose["services"]
    consul = [n for n, s in services.items() if str(s.get("image", "")).startswith("hashicorp/consul:")]
    if len(consul) != 1:
        problems.append(f"one real Consul (hashicorp/consul image) expected, got {consul}")
    else:
        command = as_list(services[consul[0]].get("command"))
        if command[:1] != ["agent"] or "-dev" not in command:
            problems.append(f"Consul must run as a dev agent: {command}")
    nodes = [n for n, s in services.items() if str(s.get("image", "")).startswith("tensorflow/serving:")]
    pairs = compose_pairs(compose)
    for name, service in services.items():
        mode = service.get("network_mode", "")
        if mode.startswith("service:") and mode.split(":", 1)[1] not in services:
            problems.append(f"{name}: network_mode {mode} names no service")
    if len(nodes) != 3:
        problems.append(f"three tensorflow/serving containers expected, got {nodes}")
    if sorted(p.extra["node_service"] for p in pairs) != sorted(nodes):
        problems.append("each tensorflow/serving container needs exactly one sidecar in its network namespace")
    for pair in pairs:
        sidecar, node_service = pair.extra["sidecar"], pair.extra["node_service"]
        if sidecar.get("pid") != f"service:{node_service}":
            problems.append(f"{pair.name}: pid must be service:{node_service} (psutil measures TF Serving)")
        if consul and consul[0] not in (sidecar.get("depends_on") or []):
            problems.append(f"{pair.name}: must depend on {consul[0]}")
        build = sidecar.get("build") or {}
        if (DEPLOY / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).resolve() != DOCKERFILE:
            problems.append(f"{pair.name}: must be built from deploy/Dockerfile")
    names = [p.sidecar_env.get(env_name("ring.self_name")) for p in pairs]
    if None in names or len(set(names)) != len(names):
        problems.append(f"each sidecar needs its own {env_name('ring.self_name')}: {names}")
    published = {int(str(p).split(":")[-1]) for s in services.values() if not str(s.get("image", "")).startswith(
        "hashicorp/consul") for p in s.get("ports", [])}
    if published != set(sidecar_ports().values()):
        problems.append(f"the sidecar ports published {sorted(published)} != the settings' defaults "
                        f"{sidecar_ports()}")
    return problems


# -- Kubernetes -----------------------------------------------------------------------------


def load_k8s() -> dict[tuple[str, str], dict]:
    """(kind, name) -> object for every manifest in deploy/k8s/ listed by its kustomization."""
    objects = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def container(statefulset: Mapping, name: str) -> dict:
    for c in statefulset["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise KeyError(f"no container {name!r}")


def expand_env(c: Mapping, example: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """A container's environment with $(VAR) references expanded as the kubelet does.

    Downward-API values (fieldRef) get the example values given; a reference to a variable
    not defined earlier in the list is a problem (the kubelet would leave it literal).
    """
    env, problems = {}, []
    for item in c.get("env", []):
        if "valueFrom" in item:
            field_path = item["valueFrom"].get("fieldRef", {}).get("fieldPath", "")
            env[item["name"]] = example.get(field_path, f"<{field_path}>")
            continue

        def sub(match: re.Match) -> str:
            if match.group(1) not in env:
                problems.append(f"{item['name']}: $({match.group(1)}) is not defined before it")
                return match.group(0)
            return env[match.group(1)]

        env[item["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, str(item.get("value", "")))
    return env, problems


def k8s_mounts(c: Mapping) -> dict[str, dict]:
    return {m["mountPath"]: {"source": m["name"], "read_only": bool(m.get("readOnly"))}
            for m in c.get("volumeMounts", [])}


def k8s_quantity(text) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", str(text))
    if not match:
        raise ValueError(f"not a byte quantity: {text!r}")
    unit = match.group(2) or ""
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[unit]
    return int(float(match.group(1)) * scale)


def port_number(c: Mapping, port) -> int | None:
    """A probe's or Service's port (number or container port name) as a number."""
    if isinstance(port, int):
        return port
    for p in c.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    return None


def k8s_pair(objects: Mapping, example_env: Mapping[str, str]) -> Pair:
    sts = objects[("StatefulSet", "tfscache")]
    node, sidecar = container(sts, "tfserving"), container(sts, "tfscache")
    env, _ = expand_env(sidecar, example_env)
    limit = node.get("resources", {}).get("limits", {}).get("memory")
    return Pair(name="k8s", tfserving_image=node["image"], tfserving_command=list(node.get("command", [])),
                tfserving_args=list(node.get("args", [])), tfserving_mounts=k8s_mounts(node),
                sidecar_mounts=k8s_mounts(sidecar), sidecar_args=list(sidecar.get("args", [])),
                sidecar_env=env, tfserving_memory_limit=k8s_quantity(limit) if limit else None,
                extra={"statefulset": sts, "node": node, "sidecar": sidecar})


def configmap_file(objects: Mapping, volumes: list[dict], mounts: Mapping[str, dict], path: str) -> str | None:
    """The text a container sees at ``path`` when it comes from a ConfigMap volume."""
    directory, _, filename = path.rpartition("/")
    mount = mounts.get(directory)
    if mount is None:
        return None
    volume = next((v for v in volumes if v["name"] == mount["source"]), None)
    if volume is None or "configMap" not in volume:
        return None
    cm = objects.get(("ConfigMap", volume["configMap"]["name"]))
    return None if cm is None else cm.get("data", {}).get(filename)


def check_k8s(objects: Mapping, grace_s: float) -> list[str]:
    problems = []
    sts = objects.get(("StatefulSet", "tfscache"))
    if sts is None:
        return ["no StatefulSet tfscache"]
    spec = sts["spec"]["template"]["spec"]
    if spec.get("shareProcessNamespace") is not True:
        problems.append("shareProcessNamespace must be true: the sidecar measures TF Serving's memory with psutil")
    names = sorted(c["name"] for c in spec["containers"])
    if names != ["tfscache", "tfserving"]:
        return problems + [f"two containers, tfserving and tfscache, expected: {names}"]
    node, sidecar = container(sts, "tfserving"), container(sts, "tfscache")
    ports = {p["containerPort"] for p in sidecar.get("ports", [])}
    if ports != set(sidecar_ports().values()):
        problems.append(f"sidecar containerPorts {sorted(ports)} != the settings' defaults {sidecar_ports()}")
    grpc_port = sidecar_ports()["server.grpc_port"]
    readiness = sidecar.get("readinessProbe", {})
    if readiness.get("grpc", {}).get("port") != grpc_port:
        problems.append(f"sidecar readiness must be gRPC health on port {grpc_port}: {readiness}")
    liveness = sidecar.get("livenessProbe", {})
    probe = liveness.get("grpc") or liveness.get("tcpSocket") or {}
    if port_number(sidecar, probe.get("port")) != grpc_port:
        problems.append(f"sidecar liveness must probe the gRPC port {grpc_port}: {liveness}")
    for c in (node, sidecar):
        resources = c.get("resources", {})
        if not resources.get("requests", {}).get("memory") or not resources.get("limits", {}).get("memory"):
            problems.append(f"{c['name']}: memory request and limit required")
        if not resources.get("requests", {}).get("cpu"):
            problems.append(f"{c['name']}: cpu request required")
    if not sidecar.get("securityContext", {}).get("runAsNonRoot"):
        problems.append("sidecar must run as non-root")
    # Shutdown order: TF Serving outlives the sidecar's drain; the pod's grace covers both.
    pre_stop = node.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] and len(pre_stop) == 2 else 0
    if sleep <= grace_s:
        problems.append(f"tfserving preStop must sleep longer than the sidecar's server.grace_s ({grace_s} s): "
                        f"{pre_stop}")
    if spec.get("terminationGracePeriodSeconds", 30) <= max(sleep, grace_s):
        problems.append("terminationGracePeriodSeconds must exceed the tfserving preStop sleep and server.grace_s")
    # Services
    headless = objects.get(("Service", sts["spec"].get("serviceName")))
    if headless is None or headless["spec"].get("clusterIP") != "None":
        problems.append(f"serviceName {sts['spec'].get('serviceName')!r} must be a headless Service")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    clients = [o for (kind, _), o in objects.items() if kind == "Service" and o["spec"].get("clusterIP") != "None"]
    if not clients:
        problems.append("no client Service")
    for svc in [o for (kind, _), o in objects.items() if kind == "Service"]:
        selector = svc["spec"].get("selector", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            problems.append(f"Service {svc['metadata']['name']} does not select the StatefulSet's pods")
        for p in svc["spec"]["ports"]:
            if port_number(sidecar, p.get("targetPort", p["port"])) not in set(sidecar_ports().values()):
                problems.append(f"Service {svc['metadata']['name']} port {p} does not reach a sidecar port")
            if p["port"] not in set(sidecar_ports().values()):
                problems.append(f"Service {svc['metadata']['name']} port {p['port']} is not a tfscache port")
    # Volumes exist
    for volume in spec.get("volumes", []):
        if "configMap" in volume and ("ConfigMap", volume["configMap"]["name"]) not in objects:
            problems.append(f"volume {volume['name']}: no ConfigMap {volume['configMap']['name']}")
        claim = volume.get("persistentVolumeClaim")
        if claim and ("PersistentVolumeClaim", claim["claimName"]) not in objects:
            problems.append(f"volume {volume['name']}: no PersistentVolumeClaim {claim['claimName']}")
    return problems


def check_kustomization() -> list[str]:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    return [f"kustomization.yaml lists {sorted(listed)} but deploy/k8s has {sorted(present)}"] if listed != present else []


# -- both deployments -----------------------------------------------------------------------


def check_shared_volume(pair: Pair, model_repository: str) -> list[str]:
    """The model repository is mounted read-only at the same path in both containers, from one source."""
    node, side = pair.tfserving_mounts.get(model_repository), pair.sidecar_mounts.get(model_repository)
    if node is None or side is None:
        return [f"{pair.name}: model_repository {model_repository!r} must be mounted in both containers "
                f"(TF Serving: {sorted(pair.tfserving_mounts)}, sidecar: {sorted(pair.sidecar_mounts)})"]
    problems = []
    if node["source"] != side["source"]:
        problems.append(f"{pair.name}: {model_repository} comes from {node['source']!r} and {side['source']!r}")
    if not (node["read_only"] and side["read_only"]):
        problems.append(f"{pair.name}: the model repository must be mounted read-only in both containers")
    return problems


def mutated(obj, path: list, value=None, *, delete: bool = False):
    """A deep copy of ``obj`` with the item at ``path`` replaced (or deleted): for failing checks."""
    out = copy.deepcopy(obj)
    target = out
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


def check_memory(pair: Pair, sidecar: settings_mod.Settings) -> list[str]:
    """The sidecar's memory cap is set and fits under TF Serving's container limit."""
    cap, limit = sidecar.cache.memory_per_node, pair.tfserving_memory_limit
    if not limit:
        return [f"{pair.name}: TF Serving needs a memory limit"]
    if not 0 < cap < limit:
        return [f"{pair.name}: cache.memory_per_node ({cap}) must be set and below TF Serving's memory "
                f"limit ({limit}); the node also needs memory for requests"]
    return []


# -- one deployment's files, wherever they come from ------------------------------------------


K8S_EXAMPLE_ENV = {"metadata.name": "tfscache-0", "status.podIP": "10.0.0.5", "status.hostIP": "10.0.1.1"}


def compose_file(pair: Pair, mounts: Mapping[str, dict], path: str) -> str | None:
    mount = mounts.get(path)
    source = compose_source(mount["source"]) if mount else None
    return source.read_text() if source is not None and source.is_file() else None


def deployments() -> dict[str, list[Pair]]:
    """Every (TF Serving, sidecar) pair per deployment, with a reader for their mounted files."""
    compose = compose_pairs(load_compose())
    for pair in compose:
        pair.extra["read"] = lambda mounts, path, pair=pair: compose_file(pair, mounts, path)
    objects = load_k8s()
    k8s = k8s_pair(objects, K8S_EXAMPLE_ENV)
    volumes = k8s.extra["statefulset"]["spec"]["template"]["spec"].get("volumes", [])
    k8s.extra["read"] = lambda mounts, path: configmap_file(objects, volumes, mounts, path)
    return {"compose": compose, "k8s": [k8s]}


def sidecar_config_text(pair: Pair) -> str:
    args = pair.sidecar_args
    path = args[args.index("--config") + 1]
    text = pair.extra["read"](pair.sidecar_mounts, path)
    if text is None:
        raise AssertionError(f"{pair.name}: --config {path} is not a mounted file")
    return text
