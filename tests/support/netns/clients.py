"""Client traffic from its own network namespace: 16 threads, Zipf model choice, deadlines.

    ip netns exec CLIENT python -m support.netns.clients --targets FILE --out results.jsonl \
        --models addk_1,...,addk_12 [--clients 16] [--alpha 1.0] [--deadline 10] [--seed 1]

``--targets`` is a JSON file with the list of sidecar addresses (``IP``; gRPC on 8500, REST on
8501) a client's load balancer would pick from; it is re-read when it changes (a test takes a
host out of it as a Service drops a pod whose readiness fails). Each thread sends Predict with
the official ``tensorflow_serving.apis`` stubs (a quarter of the threads: REST ``:predict``),
round robin over the targets, the model drawn Zipf(alpha) by rank (``addk_1`` the most
popular), each with the deadline; every answer is checked (y = x + k). One JSON line per
request goes to ``--out``: ``t`` (wall clock at send), ``s`` (seconds taken), ``target``,
``model``, ``code`` ("OK", a gRPC code name, "HTTP_<status>", or "WRONG") and ``message``.
SIGTERM stops it: requests in flight finish (within their deadline) and it exits 0.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import signal
import threading
import time
from pathlib import Path

import grpc
import requests
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.requests import predict_request

GRPC_PORT, REST_PORT = 8500, 8501


class Targets:
    """The targets file: ``{"generation": N, "addresses": [...]}``, read again before each request
    (a few hundred bytes; an mtime check could miss two writes within one clock tick)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self) -> tuple[int, list[str]]:
        current = json.loads(self.path.read_text())
        return current["generation"], current["addresses"]


def zipf_weights(count: int, alpha: float) -> list[float]:
    """Cumulative Zipf(alpha) weights by rank."""
    weights, total = [], 0.0
    for rank in range(1, count + 1):
        total += 1.0 / rank ** alpha
        weights.append(total)
    return weights


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", required=True)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--deadline", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    models = args.models.split(",")
    cumulative = zipf_weights(len(models), args.alpha)
    targets = Targets(args.targets)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out = open(args.out, "a", buffering=1)
    lock = threading.Lock()

    def record(**row) -> None:
        line = json.dumps(row)
        with lock:
            out.write(line + "\n")

    def worker(index: int) -> None:
        rng = random.Random(args.seed * 1000 + index)
        channels: dict[str, grpc.Channel] = {}
        rest = index % 4 == 3
        session = requests.Session()
        i = index
        while not stop.is_set():
            generation, current = targets.get()
            if not current:
                time.sleep(0.1)  # no target: nothing to send to until the file lists one
                continue
            target = current[i % len(current)]
            i += 1
            model = models[bisect.bisect_left(cumulative, rng.random() * cumulative[-1])]
            k = float(model.rsplit("_", 1)[1])
            x = float(rng.randrange(1000))
            sent, start = time.time(), time.monotonic()
            code, message = "OK", ""
            try:
                if rest:
                    reply = session.post(f"http://{target}:{REST_PORT}/v1/models/{model}:predict",
                                         json={"instances": [x]}, timeout=args.deadline)
                    if reply.status_code != 200:
                        code, message = f"HTTP_{reply.status_code}", reply.text[:300]
                    elif reply.json()["predictions"] != [x + k]:
                        code, message = "WRONG", reply.text[:300]
                else:
                    channel = channels.get(target)
                    if channel is None:
                        channel = channels[target] = grpc.insecure_channel(f"{target}:{GRPC_PORT}")
                    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                    got = list(stub.Predict(predict_request(model, x), timeout=args.deadline).outputs["y"].float_val)
                    if got != [x + k]:
                        code, message = "WRONG", str(got)
            except grpc.RpcError as exc:
                code, message = exc.code().name, (exc.details() or "")[:300]
            except requests.RequestException as exc:
                code, message = type(exc).__name__, str(exc)[:300]
            record(t=round(sent, 3), s=round(time.monotonic() - start, 4), target=target, model=model,
                   code=code, message=message, w=index, g=generation)
        for channel in channels.values():
            channel.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.clients)]
    for thread in threads:
        thread.start()
    (args.out.with_suffix(".started")).write_text("started\n")
    for thread in threads:
        thread.join()
    out.close()


if __name__ == "__main__":
    main()
