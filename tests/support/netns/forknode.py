"""Run ``tfscache node ARGS`` forked from the node template at SOCKET, as ``python -m tfscache
node ARGS`` would run here: in this process's network namespace, writing to its output.

    ip netns exec NS python tests/support/netns/forknode.py SOCKET node --port=9000 ...

The hosts of tests/support/netns/cluster.py start their nodes so: a host's node (also one started
again after its host was killed) costs no import of TensorFlow, ~5 s of CPU each. It waits for
the node, passes SIGTERM and SIGINT on, and exits with the node's status (128 + N for a signal N,
as a shell reports it). Killed itself, its node gets SIGTERM from the template's owner watch.
"""

from __future__ import annotations

import os
import signal
import sys

from tfscache.modelserver import template


def main(argv: list[str]) -> int:
    socket_path, *node = argv
    child = template.Child(socket_path, node, cwd=os.getcwd())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    rc = child.wait()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
