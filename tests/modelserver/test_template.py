"""tfscache.modelserver.template: nodes forked from one process that imported TensorFlow once.

Each node here is a real ``tfscache node`` forked by a real template process; the owner's
handles (``Child``) report the exit statuses subprocess would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest

from support import netns
from support.node import PYTHON, node_template, start_node
from support.process import REPO
from support.waiting import wait_until
from tfscache.modelserver import template


def predict(rest_port: int, x: float) -> list[float]:
    request = urllib.request.Request(f"http://127.0.0.1:{rest_port}/v1/models/half_plus_two:predict",
                                     data=json.dumps({"instances": [x]}).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["predictions"]


def node_flags(tmp_path, test_models, name: str) -> tuple[list[str], str]:
    ports = tmp_path / f"{name}.ports.json"
    return (["node", "--port=0", "--rest_api_port=0", "--bind_address=127.0.0.1", f"--ports_file={ports}",
             "--model_name=half_plus_two", f"--model_base_path={test_models / 'half_plus_two'}"], str(ports))


def forked(socket_path: str, tmp_path, test_models, name: str) -> tuple[template.Child, dict]:
    argv, ports = node_flags(tmp_path, test_models, name)
    child = template.Child(socket_path, argv, output=str(tmp_path / f"{name}.log"), cwd=str(REPO))
    wait_until(lambda: os.path.exists(ports) or child.poll() is not None, 60, f"{name} to serve")
    assert child.poll() is None, (tmp_path / f"{name}.log").read_text()
    return child, json.loads(Path(ports).read_text())


def test_forked_nodes_serve_side_by_side_and_report_their_exits(tmp_path, test_models):
    path = node_template()
    first, first_ports = forked(path, tmp_path, test_models, "first")
    second, second_ports = forked(path, tmp_path, test_models, "second")
    assert first.pid != second.pid and first_ports["pid"] == first.pid
    assert predict(first_ports["rest"], 1.0) == [2.5]  # both run TensorFlow, each in its own process
    assert predict(second_ports["rest"], 4.0) == [4.0]
    assert psutil.Process(first.pid).name() == "tfscache-node"
    assert first.poll() is None
    first.terminate()
    assert first.wait(30) == 0  # SIGTERM: the node stops serving and exits 0, as exec'd
    second.kill()
    assert second.wait(30) == -signal.SIGKILL  # as subprocess.Popen reports a signal
    assert "Running gRPC ModelServer at 127.0.0.1:" in (tmp_path / "first.log").read_text()


def test_a_flag_mistake_exits_2_with_the_usage(tmp_path):
    child = template.Child(node_template(), ["node", "--no_such_flag=1"], output=str(tmp_path / "bad.log"))
    assert child.wait(30) == 2
    assert "Unknown argument --no_such_flag=1" in (tmp_path / "bad.log").read_text()


def test_the_template_forks_nothing_but_a_node(tmp_path):
    with pytest.raises(template.TemplateError, match="forks `tfscache node` only"):
        template.Child(node_template(), ["serve", "--local-nodes", "1"])
    assert os.stat(node_template()).st_mode & 0o077 == 0  # its socket: its owner's alone


def test_a_wait_that_times_out_raises_like_popen(tmp_path, test_models):
    child, _ = forked(node_template(), tmp_path, test_models, "waited")
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.05)
    child.kill()
    assert child.wait(30) == -signal.SIGKILL


def test_a_killed_template_takes_its_nodes_and_refuses_no_owner_silently(tmp_path, test_models):
    path = str(tmp_path / "own.sock")
    own = subprocess.Popen([PYTHON, "-m", "tfscache.modelserver.template", path], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        template.wait_for_socket(path, lambda: own.poll() is None, 120)
        child, _ = forked(path, tmp_path, test_models, "orphan")
        node = psutil.Process(child.pid)
        own.kill()
        own.wait(30)
        assert child.wait(30) == -signal.SIGKILL  # the template closed: the status it cannot know
        wait_until(lambda: not node.is_running() or node.status() == psutil.STATUS_ZOMBIE, 30,
                   "the node to die with its template (PR_SET_PDEATHSIG)")
        with pytest.raises(template.TemplateError):
            template.Child(path, node_flags(tmp_path, test_models, "late")[0])
    finally:
        own.kill()
        own.wait(30)


def test_the_template_ends_with_its_owner(tmp_path):
    path = str(tmp_path / "owned.sock")
    owner = subprocess.Popen([PYTHON, "-c", "import subprocess, sys, time\n"
                              f"subprocess.Popen([sys.executable, '-m', 'tfscache.modelserver.template', {path!r}])\n"
                              "time.sleep(600)"], cwd=REPO)
    try:
        template.wait_for_socket(path, lambda: owner.poll() is None, 120)
        [held] = psutil.Process(owner.pid).children()
        owner.kill()  # SIGKILL: nothing of the owner's runs; the template sees its parent gone
        owner.wait(30)
        wait_until(lambda: not held.is_running() or held.status() == psutil.STATUS_ZOMBIE, 30,
                   "the template to end with its owner")
    finally:
        owner.kill()
        owner.wait(30)


def test_start_node_forks_unless_told_otherwise(tmp_path, test_models):
    with start_node(tmp_path, model_name="half_plus_two", model_base_path=str(test_models / "half_plus_two"),
                    forked=False) as execd:
        assert "node" in psutil.Process(execd.pid).cmdline()  # its own command line, flags and all
        assert predict(execd.rest_port, 0.0) == [2.0]


NO_NETNS = netns.unavailable()


@pytest.mark.skipif(NO_NETNS is not None, reason=f"no network namespaces here: {NO_NETNS}")
def test_a_node_runs_in_its_askers_network_namespace(tmp_path, test_models):
    """Asked from inside a network namespace (tests/support/netns/forknode.py, as the cluster
    tests' hosts ask), the node joins that namespace: it serves on that namespace's loopback."""
    argv, ports = node_flags(tmp_path, test_models, "inside")
    with netns.Network() as network:
        host = network.host("t")
        asker = host.popen([PYTHON, str(REPO / "tests" / "support" / "netns" / "forknode.py"),
                            node_template(), *argv], tmp_path / "inside.log",
                           {"PYTHONPATH": str(REPO)}, REPO)
        wait_until(lambda: os.path.exists(ports) or asker.poll() is not None, 60, "the node to serve")
        assert asker.poll() is None, (tmp_path / "inside.log").read_text()
        served = json.loads(Path(ports).read_text())
        theirs = os.stat(f"/proc/{served['pid']}/ns/net")
        assert theirs.st_ino == os.stat(f"/run/netns/{host.netns}").st_ino
        assert theirs.st_ino != os.stat("/proc/self/ns/net").st_ino
        status = host.exec("curl", "-s", f"http://127.0.0.1:{served['rest']}/v1/models/half_plus_two")
        assert json.loads(status)["model_version_status"][0]["state"] == "AVAILABLE"
        asker.send_signal(signal.SIGTERM)  # passed on to the node, whose status it exits with
        assert asker.wait(30) == 0


def test_a_template_listens_and_forks_at_a_path_too_long_for_a_socket_address(tmp_path):
    """A UNIX socket's address holds 107 bytes; a template in a deep state directory (a path
    longer than that) is reached through its directory's descriptor instead."""
    path = tmp_path / ("d" * 120) / "node-template.sock"
    path.parent.mkdir()
    assert len(str(path)) > 107
    own = subprocess.Popen([PYTHON, "-m", "tfscache.modelserver.template", str(path)], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        template.wait_for_socket(str(path), lambda: own.poll() is None, 120)
        child = template.Child(str(path), ["node", "--no_such_flag=1"],
                               output=str(tmp_path / "bad.log"))
        assert child.wait(30) == 2  # forked and run: the node's own usage error
        assert "Unknown argument --no_such_flag=1" in (tmp_path / "bad.log").read_text()
    finally:
        own.kill()
        own.wait(30)
