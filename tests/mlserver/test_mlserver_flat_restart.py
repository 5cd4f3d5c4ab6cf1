"""MLServer's own (flat) layout through restarts: a flat model is saved, re-loaded and pinned
again as a versioned one is (tests/admin/test_pins_default_state.py does the same for TF Serving).

One ``tfscache serve --backend mlserver`` over the session's ``mlserver_flat_repository`` pins the
flat ``addk_1`` (MLServer's version "v1") and the versioned ``addk_5``, serves the flat
``addk_3`` unpinned, and is SIGKILLed (its MLServer gets SIGTERM from PR_SET_PDEATHSIG). A second
start over the same state directory loads the pinned ones on its new, empty MLServer and pins
them again, not the other; it is then stopped with SIGTERM, and the state file it leaves names
the same pins. A flat model is saved under its internal version key, 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tritonclient.grpc as tritongrpc

from support.mlserver import PATIENT, mlserver_infer, resident_models, serve_nodes
from support.serving import start_serve
from support.waiting import process_ended, wait_until
from tfscache.admin.client import AdminClient, AdminError


def saved_models(state_dir: Path) -> list[tuple[str, int, bool]]:
    """(name, version, pinned) of each model in node0's state file, which must be valid JSON."""
    saved = json.loads((state_dir / "node0.cache.json").read_text())
    return sorted((m["name"], m["version"], m["pinned"]) for m in saved["models"])


def admin_client(serve) -> AdminClient:
    ports = json.loads((serve.directory / "ports.json").read_text())
    return AdminClient(f"127.0.0.1:{ports['admin']}", timeout_s=120)


def listed(admin: AdminClient) -> dict[str, tuple[int, str, bool]]:
    """{name: (version, state, pinned)} of node0, from the admin API's listing."""
    [node] = admin.list_models().nodes
    return {m.name: (m.version, m.state, m.pinned) for m in node.models}


def infer(serve, name: str, version: str = "") -> list[float]:
    client = tritongrpc.InferenceServerClient(serve.grpc_target)
    try:
        return mlserver_infer(tritongrpc, client, name, 5.0, version=version)
    finally:
        client.close()


def test_a_pinned_flat_model_survives_kill_9_and_a_stop(tmp_path, mlserver_flat_repository,
                                                        mlserver_bin):
    state = tmp_path / "state"
    flags = ("--backend", "mlserver", "--local-nodes", "1", "--node-command", mlserver_bin,
             "--admin-port", "0", "--set", f"node.state_dir={state}", *PATIENT)
    serve = start_serve(tmp_path, mlserver_flat_repository, *flags)
    try:
        with admin_client(serve) as admin:
            admin.pin("addk_1")  # flat, MLServer's version "v1"
            admin.pin("addk_5")  # versioned
            assert infer(serve, "addk_3") == [8.0]  # flat, no version: used, not pinned
            assert listed(admin) == {"addk_1": (0, "available", True),
                                     "addk_3": (0, "available", False),
                                     "addk_5": (1, "available", True)}
        wait_until(lambda: saved_models(state) == [("addk_1", 0, True), ("addk_3", 0, False),
                                                   ("addk_5", 1, True)], 30, "the state file")
        node = serve_nodes(serve)["node0"]["pid"]
    finally:
        assert serve.kill() == -9  # no shutdown code runs
    wait_until(lambda: process_ended(node), 60, f"MLServer {node} to exit after the SIGKILL")

    with start_serve(tmp_path, mlserver_flat_repository, *flags) as serve:
        with admin_client(serve) as admin:
            wait_until(lambda: listed(admin) == {"addk_1": (0, "available", True),
                                                 "addk_5": (1, "available", True)}, 120,
                       "addk_1 and addk_5 pinned and resident again")
            node_url = f"http://127.0.0.1:{serve_nodes(serve)['node0']['rest']}"
            assert resident_models(node_url) == {"addk_1", "addk_5"}  # the new MLServer's own
            assert infer(serve, "addk_1", "v1") == [6.0]
            assert infer(serve, "addk_1") == [6.0]
            with pytest.raises(AdminError) as refused:
                admin.evict("addk_1")
            assert (refused.value.code.name, refused.value.message) == ("FAILED_PRECONDITION", (
                "not evicted: model addk_1 version 0 is pinned on node node0 (unpin it first)"))
    assert serve.returncode == 0
    assert saved_models(state) == [("addk_1", 0, True), ("addk_5", 1, True)]
