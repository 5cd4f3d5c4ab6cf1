"""scripts/benchlib/, the front-end benchmarks' shared part: the goals of issue 31 judged from
figures, the cold rounds' order, CPU split between a serve's Python processes and its HAProxy,
and nginx grpc_pass and the naive hop forwarding real gRPC calls (issue 31, item 8)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import psutil
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))  # the benchmarks' own package, as the scripts import it
from benchlib import cpu, measure, proxies, report  # noqa: E402

ECHO = "/bench.Echo/Call"


def _model(name: str, paths: dict[str, dict]) -> dict:
    """Figures as bench_warm returns them, for the paths given (p50, ratio, Python CPU at c=16)."""
    out = {"model": name, "concurrencies": [16], "paths": {}}
    for label, (p50, ratio, python_us) in paths.items():
        groups = {"node": 500.0} if python_us is None else {"tfscache python": python_us, "node": 500.0}
        out["paths"][label] = {"p50_ms": p50, "p99_ms": p50 * 2, "rps_c16": 1000 * ratio, "ratio_c16": ratio,
                               "cpu_us_c16": groups}
    return out


def _verdicts(goals: list[dict]) -> dict[tuple[str, str], str]:
    return {(g["goal"].split(",")[0].split(" within")[0].split(" ≤")[0].split(" ≥")[0].split(" no")[0],
             g["path"]): g["verdict"] for g in goals}


def test_judge_meets_and_misses_each_goal_with_its_numbers():
    models = [_model("half_plus_two", {"direct": (1.0, 1.0, None), "nginx grpc_pass": (1.2, 0.95, None),
                                       "tfscache": (1.9, 0.80, 900.0), "tfscache haproxy": (1.29, 0.90, 60.0)})]
    rest = {"direct": {"p50_ms": 1.0}, "tfscache": {"p50_ms": 1.8}, "tfscache haproxy": {"p50_ms": 1.25}}
    cold = {"rounds": 3, "base": "tfscache", "paths": {
        "tfscache": {"median_ms": 60.0, "added_median_vs_base_ms": 0.0},
        "tfscache haproxy": {"median_ms": 61.0, "added_median_vs_base_ms": 1.0}}}
    goals = report.judge(models, "half_plus_two", rest, cold, {})
    assert _verdicts(goals) == {
        ("gRPC p50 c=1", "tfscache"): "not met", ("gRPC p50 c=1", "tfscache haproxy"): "met",
        ("REST p50 c=1", "tfscache"): "not met", ("REST p50 c=1", "tfscache haproxy"): "met",
        ("tfscache Python CPU", "tfscache"): "not met", ("tfscache Python CPU", "tfscache haproxy"): "met",
        ("req/s at c=16", "tfscache"): "not met", ("req/s at c=16", "tfscache haproxy"): "met",
        ("cold request", "tfscache haproxy"): "not met"}
    p50 = next(g for g in goals if g["path"] == "tfscache haproxy" and g["goal"].startswith("gRPC"))
    assert p50["value"] == pytest.approx(0.09) and p50["limit"] == 0.10
    assert "0.09 ms over nginx" in p50["detail"]


def test_judge_without_nginx_says_why_it_is_not_measured():
    models = [_model("addk_1", {"direct": (1.0, 1.0, None), "tfscache haproxy": (1.1, 0.9, 50.0)})]
    why = "nginx not found on PATH nor in /usr/sbin: apt-get install nginx-light"
    goals = report.judge(models, "addk_1", None, None, {"nginx grpc_pass": why})
    p50 = next(g for g in goals if g["goal"].startswith("gRPC"))
    assert p50["verdict"] == "not measured" and p50["detail"] == why
    summary = report.summarize(models, "addk_1", None, None, {"nginx grpc_pass": why})
    text = "\n".join(report.summary_markdown(summary))
    assert f"skipped: nginx grpc_pass: {why}" in text
    assert "| tfscache haproxy | 1.10 | 2.20 | – | 900 | 0.90 | 50 | – | – | 500 | – |" in text


def test_cold_rounds_take_a_fresh_model_each_time_and_turn_the_order():
    calls = []
    firsts = {label: (lambda name, label=label: calls.append(("first", label, name))) for label in ("a", "b")}
    resets = {label: (lambda name, label=label: calls.append(("reset", label, name))) for label in ("a", "b")}
    out = measure.cold_rounds(["m0", "m1", "m2", "m3", "m4"], firsts, resets)
    assert calls == [("first", "a", "m0"), ("reset", "a", "m0"), ("first", "b", "m0"), ("reset", "b", "m0"),
                     ("first", "a", "m1"), ("reset", "a", "m1"), ("first", "b", "m2"), ("reset", "b", "m2"),
                     ("first", "b", "m3"), ("reset", "b", "m3"), ("first", "a", "m4"), ("reset", "a", "m4")]
    assert out["rounds"] == 2 and out["base"] == "a"
    assert len(out["paths"]["b"]["all_ms"]) == 2 and out["paths"]["a"]["added_median_vs_base_ms"] == 0.0


_TREE = """
import subprocess, sys, time
haproxy = subprocess.Popen(["/usr/sbin/haproxy", "-W", "-db", "-f", sys.argv[1]])
node = subprocess.Popen([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                         "while time.process_time() - t < 0.3: pass\\nprint('burnt', flush=True)\\ntime.sleep(60)"],
                        stdout=subprocess.PIPE, text=True)
node.stdout.readline()
print(haproxy.pid, node.pid, flush=True)
time.sleep(60)
"""


def test_serve_cpu_splits_haproxy_from_python_and_leaves_the_node_out(tmp_path):
    """A parent standing for a serve, with a real HAProxy (master and worker) and a child standing
    for its node that has burnt 0.3 s of CPU: the node's CPU is in neither group."""
    config = tmp_path / "haproxy.cfg"
    config.write_text(textwrap.dedent(f"""\
        global
            nbthread 1
        defaults
            mode http
            timeout client 5s
            timeout server 5s
            timeout connect 5s
        frontend f
            bind unix@{tmp_path / 'h.sock'}
            http-request return status 200
        """))
    parent = subprocess.Popen([sys.executable, "-c", _TREE, str(config)], stdout=subprocess.PIPE, text=True)
    try:
        haproxy_pid, node_pid = map(int, parent.stdout.readline().split())
        deadline = time.monotonic() + 10
        while len(psutil.Process(haproxy_pid).children()) < 1:  # the master has forked its worker
            assert time.monotonic() < deadline, "HAProxy started no worker"
            time.sleep(0.01)
        node_cpu = sum(psutil.Process(node_pid).cpu_times()[:2])
        split = cpu.serve_cpu(parent.pid, node_pid=node_pid)
        own = sum(psutil.Process(parent.pid).cpu_times()[:2])
        haproxy = sum(sum(p.cpu_times()[:2]) for p in cpu._tree(haproxy_pid))
        assert node_cpu >= 0.3
        assert split["tfscache python"] == pytest.approx(own, abs=0.02)
        assert split["haproxy"] == pytest.approx(haproxy, abs=0.02)
        assert split["tfscache python"] + split["haproxy"] < node_cpu
    finally:
        for p in reversed(cpu._tree(parent.pid)):
            p.kill()
        parent.wait()
        parent.stdout.close()


@pytest.fixture
def echo_server():
    """A gRPC server answering ``ECHO`` with the request's bytes reversed, on 127.0.0.1, port 0."""
    def handler(request: bytes, context) -> bytes:
        return request[::-1]

    class Generic(grpc.GenericRpcHandler):
        def service(self, details):
            return grpc.unary_unary_rpc_method_handler(handler) if details.method == ECHO else None

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        server = grpc.server(pool)
        server.add_generic_rpc_handlers([Generic()])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        yield f"127.0.0.1:{port}"
        server.stop(None).wait()


def _through(target: str) -> list[bytes]:
    with grpc.insecure_channel(target) as channel:
        return [channel.unary_unary(ECHO)(b"abc%d" % i, timeout=10) for i in range(3)]


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_nginx_grpc_pass_and_the_naive_hop_forward_calls(echo_server, tmp_path, transport):
    if proxies.nginx_binary() is None:
        pytest.skip(f"nginx is not installed ({proxies.NGINX_INSTALL})")
    nginx, nginx_target = proxies.start_nginx(echo_server, tmp_path, transport)
    assert nginx is not None, nginx_target
    hop, hop_target = proxies.start_hop(echo_server, tmp_path, transport)
    try:
        assert nginx_target.startswith("unix:") == (transport == "unix") == hop_target.startswith("unix:")
        for target in (nginx_target, hop_target):
            assert _through(target) == [b"0cba", b"1cba", b"2cba"]
        meter = cpu.proxy_meter("nginx", nginx.pid, node_pid=psutil.Process().pid)
        assert set(meter()) == {"nginx", "node"}
        assert len(cpu._tree(nginx.pid)) == 2  # master and one worker
    finally:
        proxies.stop(hop)
        proxies.stop(nginx)


def test_without_nginx_start_nginx_names_the_package(echo_server, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    assert proxies.nginx_binary(search=str(empty)) is None
    process, why = proxies.start_nginx(echo_server, tmp_path, search=str(empty))
    assert process is None and why.endswith("apt-get install nginx-light")
