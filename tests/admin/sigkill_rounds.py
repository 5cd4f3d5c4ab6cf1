"""Rounds of pin (or unpin) through the admin API, SIGKILL of ``tfscache serve`` as soon as the
reply is read, a restart over the same state directory, and a check of every pin.

    result = sigkill_rounds(node, repository, directory, models, rounds)
    result.lost                  # [(round, expected pins, found pins)]: must be []

One ``tfscache node`` runs throughout; ``tfscache serve`` is a sidecar in front of it
(``--node-address``), so each round restarts only serve, the process that acknowledges. Each
serve is forked from a process that imported it once (``forked_serve``: the child runs the
``tfscache serve`` command's own ``main``). Round R pins ``models[R % len(models)]`` if it is
not pinned, else unpins it. A pin the kill lost shows as a model not pinned after the restart
(the node still holds it: it is adopted unpinned), an unpin lost as one still pinned.

Used by tests/admin/test_durable_acks.py (a few rounds) and scripts/soak_durable_acks.py (50).
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from admin.forked_serve import start_forked_serve
from support.waiting import wait_until
from tfscache.admin.client import AdminClient


@dataclass
class Rounds:
    """What the rounds saw: lost acknowledgements, kill delays and round times (seconds)."""

    rounds: int
    lost: list[tuple[int, list[str], list[str]]] = field(default_factory=list)
    kill_delays: list[float] = field(default_factory=list)
    round_s: list[float] = field(default_factory=list)
    pinned_at_end: set[str] = field(default_factory=set)
    pins: int = 0
    unpins: int = 0


def start_sidecar(directory: Path, repository: Path, node, run: int):
    """``tfscache serve`` in front of ``node``, its state in ``directory / "state"`` every time
    (forked from a process that imported it once: ``forked_serve``); (process, admin target)."""
    ports_file = directory / f"ports-{run}.json"
    log_path = directory / f"serve-{run}.log"
    process = start_forked_serve(
        ["--model-repository", str(repository), "--node-address", f"127.0.0.1:{node.grpc_port},{node.rest_port}",
         "--grpc-port", "0", "--rest-port", "0", "--admin-port", "0", "--bind-address", "127.0.0.1",
         "--ports-file", str(ports_file), "--set", f"node.state_dir={directory / 'state'}"], log_path)
    deadline = time.monotonic() + 120
    while not ports_file.exists():
        assert process.is_alive(), f"tfscache serve exited with {process.exitcode}:\n{log_path.read_text()[-6000:]}"
        assert time.monotonic() < deadline, f"tfscache serve did not serve:\n{log_path.read_text()[-6000:]}"
        time.sleep(0.01)  # polling for the ports file, with a deadline
    return process, f"127.0.0.1:{json.loads(ports_file.read_text())['admin']}"


def pinned_after_start(admin: AdminClient) -> set[str]:
    """The pinned models once the cache has re-adopted what its state file says (healthy)."""
    def healthy() -> bool:
        [state] = admin.list_models().nodes
        return state.healthy

    wait_until(healthy, 60, "the restarted sidecar's cache to re-adopt its models")
    [state] = admin.list_models().nodes
    return {m.name for m in state.models if m.pinned}


def sigkill_rounds(node, repository: Path, directory: Path, models: list[str], rounds: int) -> Rounds:
    """``rounds`` rounds of acknowledge-then-SIGKILL, then one last restart and check."""
    result = Rounds(rounds)
    expected: set[str] = set()
    for run in range(rounds + 1):
        started = time.monotonic()
        process, admin_target = start_sidecar(directory, repository, node, run)
        try:
            with AdminClient(admin_target, timeout_s=60) as admin:
                found = pinned_after_start(admin)
                if found != expected:
                    result.lost.append((run, sorted(expected), sorted(found)))
                    expected = found  # go on from what is there; the caller's assertion fails
                if run == rounds:  # the last restart only checks
                    break
                model = models[run % len(models)]
                if model in expected:
                    admin.unpin(model)
                    expected.discard(model)
                    result.unpins += 1
                else:
                    admin.pin(model)
                    expected.add(model)
                    result.pins += 1
                replied = time.monotonic()
                os.kill(process.pid, signal.SIGKILL)  # at once: nothing after the reply is waited for
                result.kill_delays.append(time.monotonic() - replied)
        finally:
            process.kill()
            process.join(30)
        result.round_s.append(time.monotonic() - started)
    result.pinned_at_end = expected
    return result
