"""`tfscache serve`'s embedded nodes, forked from its node template (tfscache.kinds.supervisor).

A killed node is forked again from the same template; a killed template takes its node with it,
and serve starts a fresh template and forks the node from that; ``node.fork_nodes=false`` runs
each node as an interpreter of its own.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import psutil

from support.serving import start_serve
from support.waiting import wait_until


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
    with start_serve(tmp_path, frontend_repo, "--local-nodes", "1") as serve:
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
