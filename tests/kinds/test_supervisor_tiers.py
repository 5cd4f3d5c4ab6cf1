"""The supervisor's host-tier children (docs/tiers.md): started as the others, named host0...,
with every GPU hidden from them. The children here are small Python processes standing in for
node processes: they report ports as a node does and write what CUDA would read."""

from __future__ import annotations

import json
import sys

from tfscache.kinds.supervisor import Launch, Supervisor, free_ports
from tfscache.settings import NodeSection

CHILD = """
import json, os, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
(out / (sys.argv[2] + ".cuda")).write_text(json.dumps(os.environ.get("CUDA_VISIBLE_DEVICES")))
(out / (sys.argv[2] + ".ports.json")).write_text(json.dumps({"grpc": 1, "rest": 2}))
time.sleep(600)  # a node serves until it is stopped
"""


async def test_host_tier_children_have_the_gpu_hidden(tmp_path):
    def launcher(node) -> Launch:
        return Launch([sys.executable, "-c", CHILD, str(tmp_path), node.name],
                      env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "0"},
                      ports_file=tmp_path / f"{node.name}.ports.json")

    supervisor = Supervisor(NodeSection(local_nodes=1, local_host_nodes=2), tmp_path / "state",
                            launcher=launcher)
    nodes = await supervisor.start()
    try:
        assert [(n.name, n.tier) for n in nodes] == [("node0", "gpu"), ("host0", "host"),
                                                      ("host1", "host")]
        seen = {n.name: json.loads((tmp_path / f"{n.name}.cuda").read_text()) for n in nodes}
        assert seen == {"node0": "0", "host0": "", "host1": ""}
    finally:
        await supervisor.stop(grace=1.0)


def test_ports_chosen_for_a_node_are_distinct():
    """A node that cannot bind port 0 gets ports tfscache chose (``free_ports``): held open
    together, so no two are the same (one after the other, the kernel handed a just-closed port
    out again, and a tritonserver given it for HTTP and gRPC refused to start)."""
    for _ in range(200):
        ports = free_ports(3)
        assert len(set(ports)) == 3 and all(1024 <= p < 65536 for p in ports), ports
