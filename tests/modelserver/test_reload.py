"""HandleReloadConfigRequest semantics against real nodes (docs/upstream/tfserving.md,
"ModelService.HandleReloadConfigRequest").

One node serves the module; every test installs the full config it needs (a reload
is a full replacement) and uses its own model names, since END entries persist.
Loads are held or failed deterministically with --load_gate_dir.
"""

from __future__ import annotations

import concurrent.futures
import re
import shutil
import threading
import time

import grpc
import pytest
from support import fixtures
from support.node import model_config, start_node, version_states, wait_for_states
from support.requests import predict_request, reload_request, status_request
from support.waiting import wait_until
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from tfscache.errors import DeadlineExceeded, Internal, InvalidArgument, NotFound, Unavailable, code_name


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def node(tmp_path_factory, gate):
    flags = ["--max_num_load_retries=2", "--load_retry_interval_micros=0", f"--load_gate_dir={gate}"]
    with start_node(tmp_path_factory.mktemp("reload"), config="model_config_list {}\n", flags=flags) as node:
        yield node


channel = fixtures.channel_to("node")
stub = fixtures.model_stub


@pytest.fixture
def background():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        yield pool


def reload(stub, models, timeout=60, **per_model):
    return stub.HandleReloadConfigRequest(reload_request(model_config(models, **per_model)), timeout=timeout)


def reload_error(stub, models, timeout=60, **per_model):
    with pytest.raises(grpc.RpcError) as info:
        reload(stub, models, timeout, **per_model)
    return info.value.code(), info.value.details()


def predict(channel, name, *, version=None, label=None, x=2.0):
    request = predict_request(name, x, version=version, label=label)
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return response.model_spec.version.value, list(response.outputs["y"].float_val)


# -- full replacement, what the RPC waits for -----------------------------------------------


def test_config_is_a_full_replacement_and_end_persists(stub, channel, test_models):
    two, three = test_models / "half_plus_two", test_models / "half_plus_three"
    reload(stub, {"rep_a": two, "rep_b": three})
    assert version_states(stub, "rep_a") == {124: ("AVAILABLE", 0, "")}
    assert version_states(stub, "rep_b") == {123: ("AVAILABLE", 0, "")}
    reload(stub, {"rep_b": three})
    wait_for_states(stub, "rep_a", {124: "END"})
    assert version_states(stub, "rep_a") == {124: ("END", 0, "")}  # not NOT_FOUND
    assert predict(channel, "rep_b") == (123, [4.0])
    with pytest.raises(grpc.RpcError) as info:
        predict(channel, "rep_a")
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(rep_a)")


def test_reload_waits_for_a_new_model(stub, gate, background, test_models):
    (gate / "wait_new.hold").touch()
    call = background.submit(reload, stub, {"wait_new": test_models / "half_plus_two"})
    wait_until((gate / "wait_new.124.waiting").exists, 30, "wait_new 124's load at its gate",
               interval=0.01)
    assert version_states(stub, "wait_new") == {124: ("LOADING", 0, "")}
    assert not call.done()
    (gate / "wait_new.hold").unlink()
    assert call.result(timeout=60).status.error_code == 0
    assert version_states(stub, "wait_new") == {124: ("AVAILABLE", 0, "")}


def test_reload_does_not_wait_for_removed_models_and_transitions_preserve_availability(
        stub, channel, gate, background, test_models, tmp_path):
    # The manager loads serially (--num_load_threads=0) and unloads on its own thread
    # (--num_unload_threads=0): a held load of a new version of "tr_keep" blocks the
    # unload of "tr_gone", so a reload that returns meanwhile did not wait for it.
    base = tmp_path / "tr_keep"
    shutil.copytree(test_models / "half_plus_two" / "00000123", base / "1")
    reload(stub, {"tr_keep": base, "tr_gone": test_models / "half_plus_three"})
    (gate / "tr_keep.hold").touch()
    shutil.copytree(test_models / "half_plus_two" / "00000123", base / "2")
    wait_until((gate / "tr_keep.2.waiting").exists, 30, "tr_keep 2's load at its gate",
               interval=0.01)
    reload(stub, {"tr_keep": base}, timeout=10)
    assert version_states(stub, "tr_gone") == {123: ("AVAILABLE", 0, "")}
    assert version_states(stub, "tr_keep") == {1: ("AVAILABLE", 0, ""), 2: ("LOADING", 0, "")}
    assert predict(channel, "tr_keep") == (1, [3.0])  # the old version serves meanwhile
    (gate / "tr_keep.hold").unlink()
    wait_for_states(stub, "tr_keep", {1: "END", 2: "AVAILABLE"})
    wait_for_states(stub, "tr_gone", {123: "END"})
    assert predict(channel, "tr_keep") == (2, [3.0])


# -- failures: END with the error, retries, stickiness ---------------------------------------


def test_failed_load_is_end_with_error_and_sticky_until_removed(stub, node, gate, test_models):
    (gate / "sticky.fail").touch()
    models = {"sticky": test_models / "half_plus_two"}
    assert reload_error(stub, models) == (
        grpc.StatusCode.UNKNOWN,
        "1 model(s) did not become available: {{{name: sticky version: 124} due to error: "
        "INTERNAL: injected load failure for sticky}, }")
    assert version_states(stub, "sticky") == {124: ("END", 13, "injected load failure for sticky")}
    # --max_num_load_retries=2: three attempts
    assert len(re.findall(r"\{name: sticky version: 124\} failed", node.log_text())) == 3
    (gate / "sticky.fail").unlink()
    reload(stub, models, timeout=10)  # same config: OK at once, and no new load
    assert version_states(stub, "sticky") == {124: ("END", 13, "injected load failure for sticky")}
    reload(stub, {})
    reload(stub, models)  # removed then re-added: loads again
    assert version_states(stub, "sticky") == {124: ("AVAILABLE", 0, "")}


def test_corrupt_saved_model_ends_with_its_error_while_others_serve(stub, channel, test_models, tmp_path):
    from support.models.tfserving import build_corrupt

    corrupt = build_corrupt(tmp_path, "corrupt")
    code, details = reload_error(stub, {"good": test_models / "half_plus_two", "corrupt": corrupt})
    assert code == grpc.StatusCode.UNKNOWN
    assert details.startswith("1 model(s) did not become available: {{{name: corrupt version: 1} due to error: ")
    state, error_code, message = version_states(stub, "corrupt")[1]
    assert state == "END" and error_code != 0 and message
    assert details.endswith(f" due to error: {code_name(error_code)}: {message}}}, }}")
    assert predict(channel, "good") == (124, [3.0])


# -- version policies and labels -----------------------------------------------------------


def test_version_policies(stub, test_models):
    two = test_models / "half_plus_two"
    reload(stub, {"pol_default": two, "pol_latest2": two, "pol_all": two, "pol_specific": two},
           pol_latest2="model_version_policy { latest { num_versions: 2 } }",
           pol_all="model_version_policy { all {} }",
           pol_specific="model_version_policy { specific { versions: 123 } }")
    wait_for_states(stub, "pol_default", {124: "AVAILABLE"})
    wait_for_states(stub, "pol_latest2", {123: "AVAILABLE", 124: "AVAILABLE"})
    wait_for_states(stub, "pol_all", {123: "AVAILABLE", 124: "AVAILABLE"})
    wait_for_states(stub, "pol_specific", {123: "AVAILABLE"})
    # A policy change of a listed model applies at the next poll; the RPC does not wait.
    reload(stub, {"pol_specific": two}, pol_specific="model_version_policy { specific { versions: 124 } }")
    wait_for_states(stub, "pol_specific", {123: "END", 124: "AVAILABLE"})


def test_version_labels(stub, channel, test_models):
    two = test_models / "half_plus_two"
    policy = "model_version_policy { all {} }"
    labelled = policy + ' version_labels { key: "stable" value: 123 } version_labels { key: "canary" value: 124 }'
    # A model and its labels cannot be added in one reload.
    stable = policy + ' version_labels { key: "stable" value: 123 }'
    assert reload_error(stub, {"lab": two}, lab=stable) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "Request to assign label to version 123 of model lab, which is not currently available for inference")
    reload(stub, {"lab": two}, lab=policy)
    wait_for_states(stub, "lab", {123: "AVAILABLE", 124: "AVAILABLE"})
    reload(stub, {"lab": two}, lab=labelled)
    assert predict(channel, "lab", label="stable") == (123, [3.0])
    assert predict(channel, "lab", label="canary") == (124, [3.0])
    with pytest.raises(grpc.RpcError) as info:
        predict(channel, "lab", label="nope")
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: nope")
    assert reload_error(stub, {"lab": two}, lab=policy + ' version_labels { key: "x" value: 999 }') == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "Request to assign label to version 999 of model lab, which is not currently available for inference")


# -- validation ----------------------------------------------------------------------------


def test_validation_errors(stub, test_models):
    two = test_models / "half_plus_two"
    duplicate = ('model_config_list { config { name: "dup" base_path: "/a" model_platform: "tensorflow" } '
                 'config { name: "dup" base_path: "/b" model_platform: "tensorflow" } }')
    with pytest.raises(grpc.RpcError) as info:
        stub.HandleReloadConfigRequest(reload_request(duplicate), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Illegal to list model dup multiple times in config list")
    assert reload_error(stub, {"rel": "relative/path"}) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "Expected model rel to have an absolute path or URI; got base_path()=relative/path")
    reload(stub, {"val_ok": two})  # neither error touched config_: later reloads work


def test_unsupported_platform_poisons_the_config_until_removed(stub, test_models):
    two = test_models / "half_plus_two"
    foo = f'model_config_list {{ config {{ name: "plat" base_path: "{two}" model_platform: "foo" }} }}'
    with pytest.raises(grpc.RpcError) as info:
        stub.HandleReloadConfigRequest(reload_request(foo), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Model plat requests unsupported platform foo")
    assert reload_error(stub, {"plat": two}) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "Illegal to change a model's platform. For model plat platform was foo and new platform "
        "requested is tensorflow")
    reload(stub, {})
    reload(stub, {"plat": two})
    assert version_states(stub, "plat") == {124: ("AVAILABLE", 0, "")}


# -- the missing-base-path hang ---------------------------------------------------------------


def test_missing_base_path_hangs_reloads_until_it_appears(stub, node, test_models, tmp_path):
    ghost = tmp_path / "ghost"
    models = {"hang_ok": test_models / "half_plus_three", "ghost": ghost}
    finished = node.log_text().count("Finished reloading config")
    assert reload_error(stub, models, timeout=2) == (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    # Reads go on; the config lock is still held, so the next reload waits too.
    assert version_states(stub, "ghost") == {}
    assert reload_error(stub, models, timeout=1) == (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert version_states(stub, "hang_ok") == {}  # the aborted polls sent nothing for anyone
    shutil.copytree(test_models / "half_plus_two" / "00000123", ghost / "1")
    wait_for_states(stub, "ghost", {1: "AVAILABLE"})
    wait_for_states(stub, "hang_ok", {123: "AVAILABLE"})
    node.wait_for_log("Finished reloading config", count=finished + 2)  # both hung reloads ended
    reload(stub, {"hang_ok": test_models / "half_plus_three"}, timeout=10)
    wait_for_states(stub, "ghost", {1: "END"})


# -- --file_system_poll_wait_seconds=0 -----------------------------------------------------------


def test_poll_period_zero_never_finishes_a_reload_that_adds_a_model(tmp_path, test_models):
    config = model_config({"half_plus_two": test_models / "half_plus_two"})
    with start_node(tmp_path, config=config, flags=["--file_system_poll_wait_seconds=0"]) as node, \
            grpc.insecure_channel(node.grpc_target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        models = {"half_plus_two": test_models / "half_plus_two", "half_plus_three": test_models / "half_plus_three"}
        assert reload_error(stub, models, timeout=2) == (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        with pytest.raises(grpc.RpcError) as info:
            stub.GetModelStatus(status_request("half_plus_three"), timeout=10)
        assert (info.value.code(), info.value.details()) == (
            grpc.StatusCode.NOT_FOUND, "Could not find any versions of model half_plus_three")
        assert predict(channel, "half_plus_two") == (124, [3.0])


# -- keep last on the shared node: it leaves the node unable to reload ---------------------------


def test_missing_platform_poisons_every_later_reload(stub, channel, test_models):
    # GetPlatform fails after config_ was replaced; every later reload then fails in
    # ValidateNoModelsChangePlatforms, which calls GetPlatform on the stored config.
    two = test_models / "half_plus_two"
    reload(stub, {"nop_ok": two})
    no_platform = f'model_config_list {{ config {{ name: "nop" base_path: "{two}" }} }}'
    error = (grpc.StatusCode.INVALID_ARGUMENT,
             "Illegal setting neither ModelServerConfig::model_type (deprecated) "
             "nor ModelServerConfig::model_platform.")
    with pytest.raises(grpc.RpcError) as info:
        stub.HandleReloadConfigRequest(reload_request(no_platform), timeout=10)
    assert (info.value.code(), info.value.details()) == error
    assert reload_error(stub, {"nop_ok": two}) == error
    assert reload_error(stub, {}) == error
    assert predict(channel, "nop_ok") == (124, [3.0])  # serving is unaffected


# -- ServingCore in-process, with a loader we control (deterministic concurrency) ----------------


class FakeServable:
    """What the core manages: records its unload. Not a model; the core never runs it."""

    def __init__(self, name, version):
        self.name, self.version, self.unloaded = name, version, False

    def unload(self):
        self.unloaded = True


class Loader:
    """A loader whose calls can be held (per model) or failed (first N calls)."""

    def __init__(self, hold=(), fail_first=0):
        self.hold = {name: threading.Event() for name in hold}
        self.entered = {name: threading.Event() for name in hold}
        self.fail_first = fail_first
        self.calls: list[tuple[str, int]] = []

    def __call__(self, name, version, path):
        self.calls.append((name, version))
        if len(self.calls) <= self.fail_first:
            raise Internal(f"failure {len(self.calls)}")
        if name in self.hold:
            self.entered[name].set()
            assert self.hold[name].wait(30)
        return FakeServable(name, version)


def make_core(loader, **options):
    from tfscache.modelserver.server_core import ManagerOptions, ServingCore

    options = {"file_system_poll_wait_seconds": 0.02, "load_retry_interval_micros": 0, **options}
    return ServingCore(ManagerOptions(**options), loader=loader)


def config_of(models):
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    return text_format.Parse(model_config(models), model_server_config_pb2.ModelServerConfig())


def spec(name, version=None):
    from tensorflow_serving.apis import model_pb2

    model_spec = model_pb2.ModelSpec(name=name)
    if version is not None:
        model_spec.version.value = version
    return model_spec


def state_of(core, name, version):
    state = core.states(name).get(version)
    return state and state.state.name


@pytest.fixture
def versions_dir(tmp_path):
    def make(name, *versions):
        for version in versions:
            (tmp_path / name / str(version)).mkdir(parents=True)
        return tmp_path / name
    return make


def test_in_flight_handle_keeps_its_version_alive_through_an_unload(versions_dir):
    core = make_core(Loader())
    try:
        core.reload(config_of({"m": versions_dir("m", 1)}))
        with core.servable(spec("m")) as servable:
            core.reload(config_of({}))  # returns without waiting for the unload
            wait_until(lambda: state_of(core, "m", 1) == "UNLOADING", 10, "m 1 UNLOADING",
                       interval=0.005)
            for request, text in ((spec("m"), "Latest(m)"), (spec("m", 1), "Specific(m, 1)")):
                with pytest.raises(NotFound) as info:
                    with core.servable(request):
                        pass
                assert info.value.message == f"Servable not found for request: {text}"
            time.sleep(0.2)  # nothing may happen while the handle is held
            assert state_of(core, "m", 1) == "UNLOADING" and not servable.unloaded
        wait_until(lambda: state_of(core, "m", 1) == "END", 10, "m 1 END", interval=0.005)
        assert servable.unloaded
    finally:
        core.stop()


def test_state_stays_loading_between_retries(versions_dir):
    loader = Loader(hold=["r"], fail_first=1)
    core = make_core(loader, max_num_load_retries=1)
    try:
        core.reload(config_of({}))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(core.reload, config_of({"r": versions_dir("r", 1)}))
            assert loader.entered["r"].wait(10)  # second attempt, after one failure
            assert loader.calls == [("r", 1), ("r", 1)]
            assert state_of(core, "r", 1) == "LOADING" and not call.done()
            loader.hold["r"].set()
            call.result(10)  # OK: no END was published between the attempts
        assert state_of(core, "r", 1) == "AVAILABLE"
    finally:
        core.stop()


@pytest.mark.parametrize("threads", [0, 2])
def test_num_load_threads(versions_dir, threads):
    loader = Loader(hold=["a", "b"])
    core = make_core(loader, num_load_threads=threads)
    try:
        core.reload(config_of({}))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(core.reload, config_of({"a": versions_dir("a", 1), "b": versions_dir("b", 1)}))
            wait_until(lambda: loader.entered["a"].is_set() or loader.entered["b"].is_set(), 10,
                       "a load of a or b to begin", interval=0.005)
            first = "a" if loader.entered["a"].is_set() else "b"
            other = "b" if first == "a" else "a"
            if threads == 0:  # serial: the second load does not start while the first is held
                assert not loader.entered[other].wait(0.3)
                assert state_of(core, other, 1) == "START"
            else:  # parallel: both loads run at once
                assert loader.entered[other].wait(10)
            loader.hold[first].set()
            loader.hold[other].set()
            call.result(10)
    finally:
        core.stop()


def test_model_spec_resolution_errors(versions_dir):
    from tensorflow_serving.apis import model_pb2

    core = make_core(Loader())
    try:
        with pytest.raises(Unavailable) as info:
            core.resolve(model_pb2.ModelSpec(name="m", version_label="x"))
        assert info.value.message == "Model labels does not init yet.x"
        core.reload(config_of({"m": versions_dir("m", 1)}))
        with pytest.raises(InvalidArgument) as info:
            core.resolve(model_pb2.ModelSpec())
        assert info.value.message == "ModelSpec has no name specified."
        with pytest.raises(InvalidArgument) as info:
            core.resolve(model_pb2.ModelSpec(name="m", version_label="x"))
        assert info.value.message == "Unrecognized servable version label: x"
    finally:
        core.stop()


def test_optional_waiter_timeout_turns_the_hang_into_an_error(versions_dir, tmp_path):
    core = make_core(Loader(), servable_state_waiter_timeout_s=0.3)
    try:
        core.reload(config_of({}))
        with pytest.raises(DeadlineExceeded) as info:
            core.reload(config_of({"ghost": tmp_path / "missing"}))
        assert info.value.message == "Timed out waiting for model(s) to become available: ['ghost']"
    finally:
        core.stop()
