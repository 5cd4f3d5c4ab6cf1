"""Helpers shared by the tests of the Open Inference Protocol kinds (tests/triton, tests/mlserver,
tests/oip).

    with client_pairs(serve, raw) as clients:   # {"tfs": (grpc, http), "raw": (grpc, http)}
        ...
    tree_rss(pid)                               # RSS of a process and everything under it
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psutil


@contextmanager
def client_pairs(serve, raw) -> Iterator[dict[str, tuple]]:
    """gRPC and HTTP tritonclient clients of tfscache ("tfs") and of the raw server ("raw")."""
    import tritonclient.grpc as tritongrpc
    import tritonclient.http as tritonhttp

    made = {"tfs": (tritongrpc.InferenceServerClient(serve.grpc_target),
                    tritonhttp.InferenceServerClient(f"127.0.0.1:{serve.rest_port}", network_timeout=120)),
            "raw": (tritongrpc.InferenceServerClient(raw.grpc_target),
                    tritonhttp.InferenceServerClient(raw.http_target, network_timeout=120))}
    try:
        yield made
    finally:
        for grpc_client, http_client in made.values():
            grpc_client.close()
            http_client.close()


def tree_rss(pid: int) -> int:
    """RSS of process ``pid`` plus all its descendants (a process that exits meanwhile counts 0)."""
    root = psutil.Process(pid)
    total = 0
    for process in (root, *root.children(recursive=True)):
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total
