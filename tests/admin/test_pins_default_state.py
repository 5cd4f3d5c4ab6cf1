"""Pins survive ``kill -9`` and a restart with default settings (issue 10, item 5).

No ``node.state_dir``: `tfscache serve` keeps its state in the instance's persistent
default, ``$XDG_STATE_HOME/tfscache/embedded-<hash of the repository path>``
(tfscache.settings.statedir, docs/state.md). A model pinned with `tfscache pin` is pinned and
resident again after the process was SIGKILLed (its node children get SIGTERM from
PR_SET_PDEATHSIG) and started again the same way; an unpinned one is not brought back.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import requests
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.serving import link_repository, serve_command
from support.cache import Gate
from support.node import PYTHON, REPO, node_template
from support.process import ServerProcess, launch, wait_for_ports
from support.requests import predict_request
from support.waiting import process_ended, wait_until
from tfscache.admin.client import AdminClient
from tfscache.settings.statedir import claim, instance_name


class ServeStartError(RuntimeError):
    pass


class DefaultStateServe(ServerProcess):
    """`tfscache serve` started without node.state_dir, with its admin and metrics ports."""

    def __init__(self, process, directory: Path, log_path: Path, ports: dict) -> None:
        super().__init__(process, directory, log_path, ports)
        self.admin_target = f"127.0.0.1:{ports['admin']}"
        self.metrics_url = f"http://127.0.0.1:{ports['metrics']}"


def start_default_serve(directory: Path, repository: Path, xdg_state_home: Path, run: int,
                        *args: str) -> DefaultStateServe:
    """`tfscache serve --local-nodes 1` over ``repository``, its state where XDG_STATE_HOME says.

    Unlike support.serving.start_serve, no ``--set node.state_dir``: the default is under test.
    ``args`` are more flags.
    """
    ports_file = directory / f"ports-{run}.json"
    log_path = directory / f"serve-{run}.log"
    command = serve_command(["--model-repository", str(repository), "--local-nodes", "1", "--grpc-port", "0",
                             "--rest-port", "0", "--admin-port", "0", "--metrics-port", "0",
                             "--bind-address", "127.0.0.1", "--ports-file", str(ports_file),
                             "--set", f"node.template_socket={node_template()}", *args])
    process = launch(command, log_path, {"XDG_STATE_HOME": str(xdg_state_home)})
    ports = wait_for_ports(process, ports_file, log_path, 180,
                           lambda message, rc, log: ServeStartError(f"{message} (rc={rc}):\n{log[-6000:]}"))
    return DefaultStateServe(process, directory, log_path, ports)


def tfscache(serve: DefaultStateServe, *args: str) -> subprocess.CompletedProcess:
    """The admin CLI, ``python -m tfscache ARGS --address ADMIN``."""
    return subprocess.run([PYTHON, "-m", "tfscache", *args, "--address", serve.admin_target],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def models(serve: DefaultStateServe) -> dict[str, tuple[str, bool]]:
    """{name: (state, pinned)} of node0, from the admin API's listing."""
    with AdminClient(serve.admin_target, timeout_s=30) as admin:
        [node] = admin.list_models().nodes
        return {m.name: (m.state, m.pinned) for m in node.models}


def status_models(serve: DefaultStateServe) -> dict[str, tuple[str, bool]]:
    """{name: (state, pinned)} of node0, from /status on the metrics port (`tfscache status`)."""
    document = requests.get(f"{serve.metrics_url}/status", timeout=10).json()
    [node] = document["nodes"]
    return {m["name"]: (m["state"], m["pinned"]) for m in node["models"]}


def predict(serve: DefaultStateServe, name: str, x: float) -> list[float]:
    with grpc.insecure_channel(serve.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return list(stub.Predict(predict_request(name, x), timeout=120).outputs["y"].float_val)


def saved_models(state_dir: Path) -> list[tuple[str, int, bool]]:
    """(name, version, pinned) of each model in node0's state file, which must be valid JSON."""
    saved = json.loads((state_dir / "node0.cache.json").read_text())
    assert saved["format"] == 1
    return sorted((m["name"], m["version"], m["pinned"]) for m in saved["models"])


def node_pid(state_dir: Path) -> int:
    return json.loads((state_dir / "node0.ports.json").read_text())["pid"]


def kill_9(serve: DefaultStateServe, state_dir: Path) -> None:
    """SIGKILL ``serve`` and wait until its node child, which gets SIGTERM from PR_SET_PDEATHSIG,
    has exited too."""
    node = node_pid(state_dir)
    assert serve.kill() == -9
    wait_until(lambda: process_ended(node), 60, f"node process {node} to exit after its parent's SIGKILL")


def test_a_pin_survives_kill_9_and_restarts_with_default_settings_even_one_killed_while_it_reloads(
        synthetic_models, tmp_path):
    # Three starts over one default state directory (one test, so the starts are not repeated):
    # 1. pin addk_1, use addk_2 unpinned, SIGKILL;  2. a crash loop: killed again while the restart
    # reloads the pinned model the node lost (a big model takes minutes to load), which must still
    # leave the pin for the next start;  3. the pinned model is pinned and resident again, the
    # unpinned one is not brought back.
    repo = link_repository(tmp_path / "models", synthetic_models([1, 2]))
    xdg = tmp_path / "xdg-state"
    state_dir = xdg / "tfscache" / instance_name(model_repository=repo)
    gate = Gate(tmp_path / "gate")  # the node's loads of NAME wait while gate/NAME.hold exists
    gate.dir.mkdir()
    flags = ("--set", f"node.extra_args=--load_gate_dir={gate.dir}")

    serve = start_default_serve(tmp_path, repo, xdg, 1, *flags)
    try:
        # The default state directory: the instance's own, and held by this process.
        assert sorted(p.name for p in (xdg / "tfscache").iterdir()) == [state_dir.name]
        assert state_dir.name.startswith("embedded-")
        assert claim(state_dir) is None
        run = tfscache(serve, "pin", "addk_1")
        assert (run.returncode, run.stderr) == (0, "")
        assert run.stdout.startswith("pinned addk_1 version 1 on node node0 (")
        assert predict(serve, "addk_2", 1.0) == [3.0]  # resident, not pinned
        assert models(serve) == {"addk_1": ("available", True), "addk_2": ("available", False)}
        # The pin is saved before it is acknowledged; addk_2's load is saved off the event loop,
        # coalesced, so a kill right after the answer may come first: wait for it.
        wait_until(lambda: saved_models(state_dir) == [("addk_1", 1, True), ("addk_2", 1, False)], 30,
                   "the state file to list addk_2")
        old_node = node_pid(state_dir)
    finally:
        kill_9(serve, state_dir)  # no shutdown code runs

    # The state file the killed process left: valid JSON, with the pin it acknowledged.
    assert saved_models(state_dir) == [("addk_1", 1, True), ("addk_2", 1, False)]

    gate.hold("addk_1")
    serve = start_default_serve(tmp_path, repo, xdg, 2, *flags)
    try:
        wait_until(lambda: gate.waiting("addk_1"), 60, "the node to start loading addk_1 again (held at the gate)")
    finally:
        kill_9(serve, state_dir)
    gate.release("addk_1")
    # What the second process left must still name the pin: nothing else remembers it.
    assert [m for m in saved_models(state_dir) if m[2]] == [("addk_1", 1, True)]

    with start_default_serve(tmp_path, repo, xdg, 3, *flags) as serve:
        assert sorted(p.name for p in (xdg / "tfscache").iterdir()) == [state_dir.name]
        assert node_pid(state_dir) != old_node
        # The new node started empty: the pinned model is loaded and pinned again; the other is not.
        wait_until(lambda: models(serve) == {"addk_1": ("available", True)}, 120,
                   "addk_1 pinned and resident again (admin listing)")
        assert status_models(serve) == {"addk_1": ("available", True)}
        run = tfscache(serve, "models", "--json")
        assert run.returncode == 0
        [node] = json.loads(run.stdout)["nodes"]
        assert [(m["name"], m["version"], m["state"], m["pinned"]) for m in node["models"]] == [
            ("addk_1", "1", "available", True)]
        assert predict(serve, "addk_1", 1.0) == [2.0]
        # The state file is written off the event loop, coalesced: it catches up.
        wait_until(lambda: saved_models(state_dir) == [("addk_1", 1, True)], 30, "the state file to list the pin")
        # Still pinned: eviction is refused.
        run = tfscache(serve, "evict", "addk_1")
        assert (run.returncode, run.stderr) == (
            1, "tfscache evict: FAILED_PRECONDITION: not evicted: model addk_1 version 1 is pinned on node node0 "
               "(unpin it first)\n")
    assert serve.returncode == 0
