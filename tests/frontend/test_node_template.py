"""`tfscache serve`'s embedded nodes, forked from its node template (tfscache.kinds.supervisor).

A killed node is forked again from the same template; a killed template takes its node with it,
and serve starts a fresh template and forks the node from that; ``node.fork_nodes=false`` runs
each node as an interpreter of its own. With ``node.template_socket`` (a template several
instances share, as the suite's serves do) the nodes are forked from that one, no template of
serve's own starts, and a serve killed with SIGKILL still takes its nodes with it.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import psutil

from support.node import node_template
from support.serving import start_serve
from support.waiting import process_ended, wait_until


def predict(serve, name: str, x: float) -> list[float]:
    request = urllib.request.Request(f"{serve.rest_url}/v1/models/{name}:predict",
                                     data=json.dumps({"instances": [x]}).encode())
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["predictions"]


def templates(serve_pid: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(serve_pid).children()
            if "tfscache.modelserver.template" in c.cmdline()]


def restarted(serve, old_pid: int) -> int:
    return wait_until(lambda: (pid := serve.node_ports("node0").get("pid", old_pid)) != old_pid and pid, 120,
                      "node0's restart")


def test_a_killed_node_is_forked_again_and_a_killed_template_replaced(frontend_repo, tmp_path):
    with start_serve(tmp_path, frontend_repo, "--local-nodes", "1", own_template=True) as serve:
        [template] = templates(serve.pid)
        pid = serve.node_ports("node0")["pid"]
        node = psutil.Process(pid)
        assert node.ppid() == template.pid and node.name() == "tfscache-node"
        assert predict(serve, "addk_3", 1.0) == [4.0]

        os.kill(pid, signal.SIGKILL)  # the node: forked again from the same template
        pid = restarted(serve, pid)
        assert psutil.Process(pid).ppid() == template.pid
        assert predict(serve, "addk_3", 2.0) == [5.0]

        template.kill()  # the template: its node gets SIGTERM; serve starts a fresh template
        pid = restarted(serve, pid)
        [fresh] = templates(serve.pid)
        assert fresh.pid != template.pid and psutil.Process(pid).ppid() == fresh.pid
        assert predict(serve, "addk_3", 3.0) == [6.0]
        assert serve.log_text().count("forked node0 from the node template") == 3
        assert "starting the node template" in serve.log_text()


def test_fork_nodes_false_runs_each_node_as_its_own_interpreter(frontend_repo, tmp_path):
    with start_serve(tmp_path, frontend_repo, "--local-nodes", "1", "--set", "node.fork_nodes=false") as serve:
        assert templates(serve.pid) == []
        node = psutil.Process(serve.node_ports("node0")["pid"])
        assert "node" in node.cmdline() and "--ports_file" in " ".join(node.cmdline())
        assert predict(serve, "addk_2", 1.0) == [3.0]


def test_nodes_forked_from_a_shared_template_end_with_their_serve(frontend_repo, tmp_path):
    shared = node_template()
    [owner] = [p for p in psutil.Process().children() if shared in p.cmdline()]
    serve = start_serve(tmp_path, frontend_repo, "--local-nodes", "2", "--set",
                        f"node.template_socket={shared}", own_template=True)
    try:
        assert templates(serve.pid) == []  # none of its own
        pids = [serve.node_ports(f"node{i}")["pid"] for i in range(2)]
        assert [psutil.Process(pid).ppid() for pid in pids] == [owner.pid, owner.pid]
        assert predict(serve, "addk_3", 1.0) == [4.0]
        assert serve.log_text().count("from the shared node template at") == 2
        assert "starting the node template" not in serve.log_text()
    finally:
        serve.kill()  # SIGKILL: no shutdown code runs; each node watches the serve that asked for it
    for pid in pids:
        wait_until(lambda: process_ended(pid), 30, f"node {pid} to end with its serve")
    assert owner.is_running()  # the shared template serves on


def test_a_shared_template_that_does_not_answer_costs_no_node(frontend_repo, tmp_path):
    gone = str(tmp_path / "no-template.sock")
    with start_serve(tmp_path, frontend_repo, "--local-nodes", "1", "--set",
                     f"node.template_socket={gone}") as serve:
        assert predict(serve, "addk_3", 1.0) == [4.0]
        [template] = templates(serve.pid)  # its own, started instead
        assert psutil.Process(serve.node_ports("node0")["pid"]).ppid() == template.pid
        assert f"the node template at {gone} did not fork node0" in serve.log_text()
