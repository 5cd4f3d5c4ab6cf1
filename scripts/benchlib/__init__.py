"""What the front-end benchmarks share (scripts/bench_frontend.py, scripts/bench_triton.py).

A *path* is a label and a gRPC target in front of one node process: ``direct`` (the node),
``nginx grpc_pass``, ``naive hop`` (a grpc.aio byte hop, the floor of a Python proxy),
``tfscache`` (the Python data plane, or ``tfscache w=N``) and ``tfscache haproxy`` (issue 31).

    cpu       a path's meter: CPU seconds by process group (tfscache's Python processes,
              HAProxy, nginx, the hop, the node), and what HAProxy routed
    proxies   nginx grpc_pass and the naive hop, started in front of a node
    measure   p50/p99 at c=1 (gRPC, REST), req/s from client processes with CPU per request,
              cold rounds
    report    tables, issue 31's goals judged, the summary
"""
