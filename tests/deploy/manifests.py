"""Reading deploy/ (Dockerfile, docker-compose.yml, Kubernetes manifests) and the code's side of it.

Docker cannot run on the build machines, so the manifests are parsed, not run; checks.py
holds the checks. Expected values come from the code, never from a literal here:

* ports: the defaults of ``tfscache.settings`` (every ``*port`` setting with a default > 0);
* TF Serving flags: the table in docs/real-tfserving.md and the flag table ``FLAGS`` of
  ``tfscache.modelserver.main`` (tensorflow_model_server's names and types);
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

from . import overlays

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
# deploy/k8s's variants (kustomize overlays of deploy/k8s/base) checked like the default.
K8S_VARIANTS = ("consul", "pvc")

# The discovery settings agreed with the engineer adding them to tfscache/settings/__init__.py
# (issue 5). Used only while settings.py has no [discovery] section; once it has one,
# the manifests are checked against the real names instead.
PLANNED_DISCOVERY = {"backend", "consul_address", "service_name", "advertise_host"}
# Consul's own default HTTP API port (the agent listens there in the hashicorp/consul image).
CONSUL_HTTP_PORT = 8500
# Flags `tfscache node` accepts that tensorflow_model_server does not (tfscache/modelserver/main.py
# docstring and docs/DESIGN.md); the real binary would refuse them.
TFSCACHE_NODE_EXTENSIONS = {"bind_address", "ports_file", "load_gate_dir"}
# tensorflow_model_server flags that `tfscache node` does not take (so they are not in its
# flag table), with the type TF Serving parses them as.
TFSERVING_ONLY_FLAGS = {"enable_grpc_healthcheck_service": bool}


# -- the code's side ------------------------------------------------------------------------


def sidecar_ports() -> dict[str, int]:
    """Every listening-port setting with a fixed default: dotted name -> port."""
    ports = {}
    for dotted, f in settings_mod.iter_fields():
        default = f.default
        if dotted.rsplit(".", 1)[-1].endswith("port") and isinstance(default, int) and default > 0:
            ports[dotted] = default
    return ports


def cli_defaults() -> dict[str, str]:
    """Environment variable -> default address of the operator commands run inside a sidecar.

    ``TFSCACHE_ADMIN_ADDRESS``: tfscache models/pin/preload/evict/drain (tfscache.cli.admin,
    default tfscache.admin.client.DEFAULT_ADDRESS); ``TFSCACHE_STATUS_ADDRESS``: tfscache
    status (tfscache.cli.status; its default is read from the source, since the module applies
    the variable at import).
    """
    from tfscache.admin.client import DEFAULT_ADDRESS as admin_default

    source = (ROOT / "tfscache" / "cli" / "status.py").read_text()
    match = re.search(r'os\.environ\.get\("TFSCACHE_STATUS_ADDRESS", "([^"]+)"\)', source)
    assert match, "tfscache/cli/status.py no longer reads TFSCACHE_STATUS_ADDRESS with a literal default"
    return {"TFSCACHE_ADMIN_ADDRESS": admin_default, "TFSCACHE_STATUS_ADDRESS": match.group(1)}


# Variables the CLIs read (not settings): set in a sidecar's environment for `kubectl exec` use.
CLI_ENV = {"TFSCACHE_LOG_LEVEL", "TFSCACHE_ADMIN_ADDRESS", "TFSCACHE_ADMIN_TOKEN", "TFSCACHE_STATUS_ADDRESS"}


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
    from tfscache.modelserver import main as node_main  # no tensorflow at import time

    return node_main


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def constraints() -> list[str]:
    """constraints.txt's requirements (the exact versions installed), comments left out."""
    return [line for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


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


def tfserving_flags(args: list[str]) -> dict[str, str]:
    return parse_flag_args(args)


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


# -- Kubernetes -----------------------------------------------------------------------------


def load_k8s(variant: str = "") -> dict[tuple[str, str], dict]:
    """(kind, name) -> object as ``kubectl kustomize deploy/k8s[/VARIANT]`` renders them."""
    return overlays.render(K8S / variant if variant else K8S)


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


def k8s_pair(objects: Mapping, example_env: Mapping[str, str], name: str = "k8s") -> Pair:
    sts = objects[("StatefulSet", "tfscache")]
    node, sidecar = container(sts, "tfserving"), container(sts, "tfscache")
    env, _ = expand_env(sidecar, example_env)
    limit = node.get("resources", {}).get("limits", {}).get("memory")
    return Pair(name=name, tfserving_image=node["image"], tfserving_command=list(node.get("command", [])),
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


# -- both deployments -----------------------------------------------------------------------


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


# -- one deployment's files, wherever they come from ------------------------------------------


K8S_EXAMPLE_ENV = {"metadata.name": "tfscache-0", "status.podIP": "10.0.0.5", "status.hostIP": "10.0.1.1"}


def compose_file(mounts: Mapping[str, dict], path: str) -> str | None:
    """The text of a bind-mounted file inside a compose container (None when not mounted)."""
    mount = mounts.get(path)
    source = compose_source(mount["source"]) if mount else None
    return source.read_text() if source is not None and source.is_file() else None


def deployments() -> dict[str, list[Pair]]:
    """Every (TF Serving, sidecar) pair per deployment, with a reader for their mounted files."""
    compose = compose_pairs(load_compose())
    for pair in compose:
        pair.extra["read"] = compose_file
    k8s = [_k8s_variant(variant) for variant in ("", *K8S_VARIANTS)]
    return {"compose": compose, "k8s": k8s}


def _k8s_variant(variant: str) -> Pair:
    objects = load_k8s(variant)
    pair = k8s_pair(objects, K8S_EXAMPLE_ENV, f"k8s-{variant}" if variant else "k8s")
    volumes = pair.extra["statefulset"]["spec"]["template"]["spec"].get("volumes", [])
    pair.extra["read"] = lambda mounts, path: configmap_file(objects, volumes, mounts, path)
    pair.extra["objects"] = objects
    return pair


def sidecar_value(pair: Pair, dotted: str):
    """A setting as the pair's sidecar sees it: its TFSCACHE_* variable, else its TOML file's value."""
    if env_name(dotted) in pair.sidecar_env:
        return pair.sidecar_env[env_name(dotted)]
    value = tomllib.loads(sidecar_config_text(pair))
    for key in dotted.split("."):
        value = value.get(key, {}) if isinstance(value, dict) else {}
    return value if value != {} else None


def sidecar_config_text(pair: Pair) -> str:
    args = pair.sidecar_args
    path = args[args.index("--config") + 1]
    text = pair.extra["read"](pair.sidecar_mounts, path)
    if text is None:
        raise AssertionError(f"{pair.name}: --config {path} is not a mounted file")
    return text
