"""tfscache plan-resize, prewarm and drain against real ``tfscache serve`` processes."""

from __future__ import annotations

import functools
import json
import subprocess

import pytest

from support.admin import start_admin_serve
from support.node import PYTHON, REPO
from support.process import started_together
from tfscache.admin.client import AdminClient


def tfscache(command: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "tfscache", command, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=180)


def names(address: str) -> list[str]:
    with AdminClient(address) as admin:
        return sorted(m.name for n in admin.list_models().nodes for m in n.models)


@pytest.fixture(scope="module")
def processes(admin_repo, tmp_path_factory):
    """Two tfscache processes standing for sidecars "a" (now) and "b" (joining), shared by the module."""
    directory = tmp_path_factory.mktemp("resize")
    start = functools.partial(start_admin_serve, directory, admin_repo, "--local-nodes", "1")
    with started_together([start, start]) as (a, b):  # the two starts overlap
        yield {"a": a.admin_target, "b": b.admin_target}


@pytest.fixture
def cluster(processes):
    """The module's two processes, each with nothing resident: every test starts as on fresh ones."""
    for address in processes.values():
        with AdminClient(address) as admin:
            for name in names(address):
                admin.evict(name)
        assert names(address) == []
    return processes


def test_prewarm_preloads_the_hot_moving_models_on_their_new_owner(cluster, tmp_path):
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("".join(f"addk_{k} 1000\n" for k in range(1, 7)))
    run = tfscache("plan-resize", "--current", "a", "--new", "a,b", "--models-file", str(sizes), "--json")
    assert run.returncode == 0, run.stderr
    plan = tmp_path / "plan.json"
    plan.write_text(run.stdout)
    moving = [m["name"] for m in json.loads(run.stdout)["moved"]]
    staying = sorted({f"addk_{k}" for k in range(1, 7)} - set(moving))
    assert len(moving) >= 2 and staying  # the plan has both kinds
    with AdminClient(cluster["a"]) as a:  # hot: in use on the current owner
        a.preload(moving[0])
        a.preload(staying[0])
    addresses = ["--address", f"a={cluster['a']}", "--address", f"b={cluster['b']}"]
    run = tfscache("prewarm", "--plan", str(plan), *addresses, "--progress")
    assert (run.returncode, run.stdout) == (0, "prewarmed 1 of 1 model copies (1 models)\n"), run.stderr
    assert "1/1" in run.stderr  # the progress bar
    assert names(cluster["b"]) == [moving[0]]
    run = tfscache("prewarm", "--plan", str(plan), *addresses, "--hot", "all", "--no-progress")
    assert run.returncode == 0 and run.stderr == ""
    assert names(cluster["b"]) == sorted(moving)
    assert names(cluster["a"]) == sorted([moving[0], staying[0]])  # the old owner is not touched


def test_prewarm_by_names_reports_each_failure(cluster):
    run = tfscache("prewarm", "--models", "addk_6,nope", "--target", cluster["b"], "--no-progress")
    assert run.returncode == 1
    assert run.stderr == "tfscache prewarm: failed: nope on target: NOT_FOUND: Servable not found for request: Latest(nope)\n"
    assert run.stdout == "prewarmed 1 of 2 model copies (2 models)\n"
    assert names(cluster["b"]) == ["addk_6"]
    run = tfscache("prewarm", "--plan", "/nonexistent.json", "--address-template", "{node}:1")
    assert run.returncode == 2 and run.stderr.startswith("tfscache prewarm: cannot read plan '/nonexistent.json'")


def test_drain_follows_a_process_drain_until_it_exits(admin_repo, tmp_path):
    with start_admin_serve(tmp_path, admin_repo, "--local-nodes", "1", "--set", "server.grace_s=1") as serve:
        with AdminClient(serve.admin_target) as admin:
            admin.preload("addk_1")
            admin.preload("addk_2")
        run = tfscache("drain", "--address", serve.admin_target, "--progress")
        assert (run.returncode, run.stdout) == (0, f"drained {serve.admin_target}; the process exited\n"), run.stderr
        assert "2/2" in run.stderr
        assert serve.process.wait(60) == 0
        run = tfscache("drain", "--address", "not-an-address")
        assert (run.returncode, run.stderr) == (2, "tfscache drain: error: argument --address: 'not-an-address' is not "
                                                   "HOST:PORT (give --address-template for ring names) "
                                                   "(see tfscache drain --help)\n")


def test_prewarm_joins_only_after_every_preload_succeeded(cluster):
    run = tfscache("prewarm", "--models", "addk_5,nope", "--target", cluster["b"], "--join", "--no-progress")
    assert run.returncode == 1
    assert run.stderr.endswith("tfscache prewarm: not joining target: a preload failed\n")
    # b is no sidecar (embedded nodes): the Join it is sent is refused, and said so.
    run = tfscache("prewarm", "--models", "addk_5", "--target", cluster["b"], "--join", "--no-progress")
    assert (run.returncode, run.stdout) == (1, "prewarmed 1 of 1 model copies (1 models)\n")
    assert run.stderr == ("tfscache prewarm: failed: join target: FAILED_PRECONDITION: join: this tfscache is not in "
                          "sidecar mode (no node.node_address); it has no discovery to join\n")
