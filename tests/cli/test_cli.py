"""The ``tfscache`` command line: mistakes fail at once (exit 2, one line naming the flag and the value,
no traceback, nothing started), a missing extra names its pip command, ``--version``, and the one
``--quiet``/``--progress`` convention."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys

import pytest

from support.node import PYTHON, REPO
from tfscache import settings
from tfscache.cli import options as cliopts
from tfscache.kinds import preflight
from tfscache.extras import MissingExtra

# Runs the CLI with the named modules blocked, as if their extra were not installed.
BLOCKING = ("import sys\n"
            "for name in filter(None, sys.argv.pop(1).split(',')):\n"
            "    sys.modules[name] = None  # import fails, find_spec finds nothing\n"
            "from tfscache.cli import main\n"
            "raise SystemExit(main())\n")


def tfscache(*args: str, env: dict[str, str] | None = None, blocked: str = "",
             cwd=REPO) -> subprocess.CompletedProcess:
    argv = [PYTHON, "-c", BLOCKING, blocked, *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def spy(tmp_path_factory):
    """A --node-command that records its start: a mistake must be reported before it runs."""
    root = tmp_path_factory.mktemp("cli")
    (root / "repo").mkdir()
    program = root / "node.sh"
    program.write_text(f"#!/bin/sh\ntouch {root / 'started'}\nsleep 60\n")
    program.chmod(0o755)
    return root


def serve(spy, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return tfscache("serve", "--model-repository", str(spy / "repo"), "--node-command", str(spy / "node.sh"),
                    "--grpc-port", "0", "--rest-port", "0", *args, **kwargs)


def assert_refused(run: subprocess.CompletedProcess, *parts: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr holding every part, no traceback."""
    assert (run.returncode, run.stdout) == (2, ""), run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    for part in parts:
        assert part in run.stderr, run.stderr


SERVE_MISTAKES = [
    (["--log-level", "LOUD"], {}, ["tfscache serve: error: argument --log-level: 'LOUD' is not a log level"]),
    ([], {"TFSCACHE_LOG_LEVEL": "chatty"}, ["argument --log-level: 'chatty' is not a log level"]),
    (["--set", "cache.policy=bogus"], {}, ["bad value for setting cache.policy: 'bogus'", "lru"]),
    ([], {"TFSCACHE_CACHE_POLICY": "mru"}, ["bad value for setting cache.policy: 'mru'"]),
    (["--grpc-port", "70000"], {}, ["bad value for setting server.grpc_port: '70000'"]),
    (["--memory-per-node", "lots"], {}, ["bad value for setting cache.memory_per_node: 'lots'"]),
    (["--discovery", "zookeeper"], {}, ["bad value for setting discovery.backend: 'zookeeper'"]),
    (["--backend", "tritn"], {}, ["bad value for setting node.backend: 'tritn'"]),
    (["--set", "cache.nope=1"], {}, ["unknown setting in --set: 'cache.nope=1'"]),
    (["--max-models-per-node", "-1"], {}, ["bad value for setting cache.max_models_per_node: '-1'"]),
    (["--bogus-flag"], {}, ["unrecognized arguments: --bogus-flag"]),
    (["--bind-address", "999.1.1.1"], {}, ["bad value for setting server.bind_address: '999.1.1.1'"]),
    (["--ports-file", "/nonexistent-tfscache/p.json"], {},
     ["bad value for setting server.ports_file: '/nonexistent-tfscache/p.json' "
      "(cannot write in /nonexistent-tfscache"]),
    (["--set", "node.state_dir=/dev/null/state"], {},
     ["bad value for setting node.state_dir: '/dev/null/state' (cannot write in /dev/null: Not a directory)"]),
]


@pytest.mark.parametrize("args, env, parts", SERVE_MISTAKES, ids=[" ".join(a) or next(iter(e)) for a, e, _ in
                                                                  SERVE_MISTAKES])
def test_a_bad_serve_setting_exits_2_before_any_node_starts(spy, args, env, parts):
    assert_refused(serve(spy, *args, env=env), *parts)
    assert not (spy / "started").exists()


def test_a_bad_setting_in_the_config_file_exits_2_before_any_node_starts(spy):
    config = spy / "bad.toml"
    config.write_text('[cache]\npolicy = "bogus"\n')
    assert_refused(serve(spy, "--config", str(config)), "bad value for setting cache.policy: 'bogus'")
    assert not (spy / "started").exists()


def test_a_node_command_that_is_not_there_exits_2(spy):
    run = tfscache("serve", "--model-repository", str(spy / "repo"), "--node-command", "no-such-model-server --x")
    assert_refused(run, "bad value for setting node.node_command: 'no-such-model-server --x' "
                        "(no such program: 'no-such-model-server')")


MISTAKES = [
    (["simulate", "log.csv", "--nodes", "0"], "--nodes: a node count must be at least 1"),
    (["simulate", "log.csv", "--memory", "4XB"], "argument --memory: bad size '4XB'"),
    (["simulate", "log.csv", "--policies", "mru"], "argument --policies: unknown policy 'mru'"),
    (["simulate", "log.csv", "--quiet", "--progress"], "argument --progress: not allowed with argument -q/--quiet"),
    (["status", "--address", "nothing"], "tfscache status: error: argument --address: 'nothing' is not HOST:PORT"),
    (["status", "--timeout", "0"], "argument --timeout: '0': must be > 0"),
    (["models", "--address", "localhost:99999"], "argument --address: 'localhost:99999' is not HOST:PORT"),
    (["join", "--address", "nothing"], "tfscache join: error: argument --address: 'nothing' is not HOST:PORT"),
    (["pin", "m", "--version", "-1"], "tfscache pin: error: argument --version: '-1': must be >= 0"),
    (["preload", "m", "--timeout", "-1"], "argument --timeout: '-1': must be >= 0"),
    (["unpin", "m", "--version", "one"], "argument --version: 'one' is not a number"),
    (["evict"], "the following arguments are required: model"),
    (["drain", "--grace", "-1"], "tfscache drain: error: argument --grace: '-1': must be >= 0"),
    (["drain", "--exit-timeout", "0"], "argument --exit-timeout: '0': must be > 0"),
    (["drain", "--address", "tfscache-3"],
     "argument --address: 'tfscache-3' is not HOST:PORT (give --address-template"),
    (["drain", "--address", "b", "--address-template", "b.svc:8502"], "'b.svc:8502' lacks {node}"),
    (["plan-resize", "--current", "a", "--new", "b", "--models-file", "x", "--vnodes", "0"],
     "tfscache plan-resize: error: argument --vnodes: '0': must be > 0"),
    (["plan-resize", "--new", "b", "--models-file", "x"], "the following arguments are required: --current"),
    (["prewarm", "--models", "m", "--target", "nope"], "tfscache prewarm: error: argument --target: 'nope' is not "
                                                       "HOST:PORT"),
    (["prewarm", "--plan", "p.json", "--hot", "warm"], "argument --hot: 'warm' is not resident, all or file:PATH"),
    (["prewarm", "--plan", "p.json", "--parallel", "0"], "argument --parallel: '0': must be > 0"),
    (["prewarm", "--plan", "p.json", "--address", "a=b"], "tfscache prewarm: --address 'a=b': 'b' is not HOST:PORT"),
    (["prewarm", "--plan", "p.json", "--address-template", "x:1"], "--address-template 'x:1' lacks {node}"),
    (["nosuch"], None),
]


@pytest.mark.parametrize("args, message", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_every_command_refuses_a_bad_flag_in_one_line(args, message, tmp_path):
    run = tfscache(*args, cwd=tmp_path)
    if message is None:  # an unknown command also lists the commands
        assert (run.returncode, run.stderr.splitlines()[0]) == (2, "tfscache: unknown command 'nosuch'")
        return
    assert_refused(run, message)


def test_version_comes_from_the_package_metadata():
    run = tfscache("--version")
    assert (run.returncode, run.stdout, run.stderr) == (0, f"tfscache {importlib.metadata.version('tfscache')}\n", "")
    assert tfscache("-V").stdout == run.stdout


# -- missing extras ---------------------------------------------------------------------------


def test_node_without_its_extra_names_the_pip_command():
    run = tfscache("node", "--port=0", blocked="tensorflow,tensorflow_serving")
    assert_refused(run, "tfscache: tfscache node needs the [node] extra (tensorflow, tensorflow_serving not "
                        "installed): pip install 'tfscache[node]'")


def test_serve_with_embedded_nodes_without_tensorflow_names_the_pip_command(spy):
    run = tfscache("serve", "--model-repository", str(spy / "repo"), blocked="tensorflow")
    assert_refused(run, "tfscache serve: embedded `tfscache node` children", "(tensorflow not installed): "
                        "pip install 'tfscache[node]'")


def test_serve_with_triton_nodes_without_the_wheel_names_the_install_commands(spy):
    run = tfscache("serve", "--model-repository", str(spy / "repo"), "--backend", "triton", blocked="pytriton")
    assert_refused(run, "node.backend = triton", "pip install 'tfscache[triton]' && pip install --no-deps "
                                                 "nvidia-pytriton==0.7.0")


def test_serve_over_an_object_store_without_obstore_names_the_pip_command(spy):
    run = tfscache("serve", "--model-repository", "s3://bucket/models", blocked="obstore")
    assert_refused(run, "setting model_repository: 's3://bucket/models'", "pip install 'tfscache[storage]'")


@pytest.mark.parametrize("blocked", ["tensorflow", "pytriton"])
def test_a_sidecar_needs_no_node_extra(spy, monkeypatch, blocked):
    """Sidecar mode starts no node: tensorflow (or Triton's wheel) may be absent; embedded mode needs it."""
    monkeypatch.setitem(sys.modules, blocked, None)
    backend = "triton" if blocked == "pytriton" else "tfserving"
    repo = str(spy / "repo")
    preflight.check(settings.load(env={}, overrides={"model_repository": repo, "node.backend": backend,
                                                      "node.node_address": "127.0.0.1:8510"}))
    with pytest.raises(MissingExtra, match=f"{blocked} not installed"):
        preflight.check(settings.load(env={}, overrides={"model_repository": repo, "node.backend": backend}))


def test_a_gpu_cap_without_nvml_names_the_pip_command(spy):
    run = serve(spy, "--gpu-memory-per-node", "20GiB", blocked="pynvml")
    assert_refused(run, "tfscache serve: cache.gpu_memory_per_node = 21474836480 needs the [gpu] extra (pynvml not "
                        "installed): pip install 'tfscache[gpu]'")
    assert not (spy / "started").exists()


def test_simulate_plot_without_matplotlib_fails_before_simulating(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("time,model,load_seconds,bytes\n" + "".join(f"{t},m{t % 3},1,100\n" for t in range(50)))
    png = tmp_path / "hits.png"
    run = tfscache("simulate", str(log), "--plot", str(png), blocked="matplotlib")
    assert_refused(run, "tfscache simulate: --plot needs the [sim] extra (matplotlib not installed): "
                        "pip install 'tfscache[sim]'")
    assert not png.exists()


# -- --quiet / --progress ----------------------------------------------------------------------


@pytest.mark.parametrize("args, disable", [
    ([], None), (["--progress"], False), (["--no-progress"], True), (["--quiet"], True), (["-q"], True),
])
def test_one_output_convention(args, disable):
    parser = cliopts.Parser(prog="tfscache x")
    cliopts.add_output_flags(parser)
    assert cliopts.bar_disable(parser.parse_args(args)) is disable


def test_quiet_simulate_prints_only_the_results(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("time,model,load_seconds,bytes\n" + "".join(f"{t},m{t % 3},1,100\n" for t in range(50)))
    loud = tfscache("simulate", str(log), "--progress", cwd=tmp_path)
    quiet = tfscache("simulate", str(log), "--quiet", cwd=tmp_path)
    assert loud.returncode == quiet.returncode == 0
    assert quiet.stdout == loud.stdout and "lru" in quiet.stdout
    assert quiet.stderr == "" and "req" in loud.stderr and "simulated in" in loud.stderr


@pytest.mark.parametrize("text, value", [("info", 20), ("WARN", 30), ("debug", 10), ("5", 5)])
def test_log_levels(text, value):
    assert cliopts.log_level(text) == value


@pytest.mark.parametrize("text", ["LOUD", "", "-1"])
def test_bad_log_levels(text):
    with pytest.raises(argparse.ArgumentTypeError, match="is not a log level"):
        cliopts.log_level(text)
