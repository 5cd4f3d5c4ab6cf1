"""``tfscache node`` as a process: flags, start-up failures, signals, the config-file poller."""

from __future__ import annotations

import json
import re
import subprocess

import grpc
import pytest
from support.node import model_config, node_command, start_node, wait_for_states
from tensorflow_serving.apis import model_service_pb2_grpc

from tfscache.modelserver.main import FLAGS, FlagError, check_flags, parse_flags

# tensorflow_model_server's defaults (docs/upstream/tfserving.md, "Flags")
TF_SERVING_DEFAULTS = {
    "port": 8500, "rest_api_port": 0, "rest_api_timeout_in_ms": 30000, "model_config_file": "",
    "model_name": "default", "model_base_path": "", "model_config_file_poll_wait_seconds": 0,
    "file_system_poll_wait_seconds": 1, "max_num_load_retries": 5,
    "load_retry_interval_micros": 60_000_000, "num_load_threads": 0, "num_unload_threads": 0,
    "enable_model_warmup": True, "num_request_iterations_for_warmup": 0,
    "allow_version_labels_for_unavailable_models": False,
    "saved_model_tags": "serve", "grpc_channel_arguments": "",
}


def test_defaults_are_tensorflow_model_servers():
    flags = parse_flags([])
    assert {name: flags[name] for name in TF_SERVING_DEFAULTS} == TF_SERVING_DEFAULTS
    assert (flags["bind_address"], flags["ports_file"], flags["load_gate_dir"]) == ("0.0.0.0", "", "")


def test_flag_forms():
    flags = parse_flags(["--port=9000", "--rest_api_port", "9001", "--enable_model_warmup=false",
                         "--allow_version_labels_for_unavailable_models", "--file_system_poll_wait_seconds=0.1",
                         "--num_load_threads", "3", "--model_name", "m"])
    assert (flags["port"], flags["rest_api_port"], flags["enable_model_warmup"]) == (9000, 9001, False)
    assert flags["allow_version_labels_for_unavailable_models"] is True
    assert (flags["file_system_poll_wait_seconds"], flags["num_load_threads"], flags["model_name"]) == (0.1, 3, "m")
    assert parse_flags(["--enable_model_warmup", "false"])["enable_model_warmup"] is False
    assert parse_flags(["--enable_model_warmup", "--port=1"])["enable_model_warmup"] is True


@pytest.mark.parametrize("argv, message", [
    (["--no_such_flag=1"], "Unknown argument --no_such_flag=1"),
    (["--port=eighty"], "Illegal value for flag --port: 'eighty'"),
    (["--port"], "Flag --port needs a value"),
    (["stray"], "Unknown argument stray"),
])
def test_bad_flags(argv, message):
    with pytest.raises(FlagError) as info:
        parse_flags(argv)
    assert str(info.value).startswith(message)


def test_every_flag_has_help():
    assert all(flag.help for flag in FLAGS.values())


def run_node(*flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(node_command(flags), capture_output=True, text=True, timeout=timeout)


def test_enable_batching_is_refused_not_ignored():
    check_flags(parse_flags(["--enable_batching=false"]))  # the default, said explicitly
    with pytest.raises(FlagError) as info:
        check_flags(parse_flags(["--enable_batching"]))
    assert str(info.value).startswith("Illegal value for flag --enable_batching: true (tfscache node "
                                      "does no server-side batching")


@pytest.mark.parametrize("flag", ["--port=99999", "--rest_api_port=-2"])
def test_a_port_out_of_range_is_refused_before_anything_loads(flag):
    with pytest.raises(FlagError) as info:
        check_flags(parse_flags([flag]))
    name, value = flag[2:].split("=")
    assert str(info.value) == f"Illegal value for flag --{name}: {value} (must be a port number 0..65535)"


@pytest.mark.parametrize("flag, message", [
    ("--enable_batching", "Illegal value for flag --enable_batching: true"),
    ("--batching_parameters_file=b.config", "Unknown argument --batching_parameters_file=b.config"),
    ("--port=x", "Illegal value for flag --port: 'x'"),
])
def test_flag_mistakes_exit_2_with_the_flag_and_value(flag, message):
    result = run_node(flag, "--model_base_path=/nonexistent")
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr


async def test_port_0_with_a_socket_path_serves_grpc_on_the_socket_only(tmp_path):
    """ms/server.cc: no TCP listener then (`tfscache node` passes "" for it without --ports_file)."""
    import grpc

    from tfscache.modelserver.grpc_api import bind_ports

    server = grpc.aio.server()
    assert bind_ports(server, "", str(tmp_path / "g.sock"), None) == 0
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'g.sock'}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.unary_unary("/no.Such/Method")(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED  # reached the server
    finally:
        await server.stop(None)


def test_malformed_config_file_exits_with_the_parse_error(tmp_path):
    config = tmp_path / "bad.config"
    config.write_text("improperly formatted file")
    result = run_node(f"--model_config_file={config}", "--port=0")
    assert result.returncode != 0
    assert re.search(r"^Error parsing text-format tensorflow\.serving\.ModelServerConfig: 1:1 : ",
                     result.stderr, re.MULTILINE), result.stderr


def test_no_model_exits_non_zero():
    result = run_node("--port=0")
    assert result.returncode != 0
    assert ("Failed to start server. Error: INVALID_ARGUMENT: Both server_options.model_base_path and "
            "server_options.model_config_file are empty!") in result.stderr


def test_model_that_fails_at_start_up_exits_non_zero(tmp_path):
    from support.models.tfserving import build_corrupt

    base = build_corrupt(tmp_path, "bad")
    result = run_node("--port=0", "--model_name=bad", f"--model_base_path={base}", "--max_num_load_retries=0",
                      "--file_system_poll_wait_seconds=0.1")
    assert result.returncode != 0
    assert re.search(r"^Failed to start server\. Error: UNKNOWN: 1 servable\(s\) did not become available: "
                     r"\{\{\{name: bad version: 1\} due to error: [A-Z_]+: .+\}, \}$",
                     result.stderr, re.MULTILINE), result.stderr[-3000:]


def test_node_serves_logs_rss_follows_its_config_file_and_exits_0_on_sigterm(tmp_path, test_models):
    two, three = test_models / "half_plus_two", test_models / "half_plus_three"
    node = start_node(tmp_path, config=model_config({"half_plus_two": two}),
                      flags=["--model_config_file_poll_wait_seconds=1"])
    try:
        assert json.loads((node.directory / "ports.json").read_text())["pid"] == node.process.pid
        node.wait_for_log(r"^INFO tfscache\.node\.manager: loaded half_plus_two version 124 in \d+\.\d{3} s; "
                          r"rss=\d+$")
        with grpc.insecure_channel(node.grpc_target) as channel:
            stub = model_service_pb2_grpc.ModelServiceStub(channel)
            node.config_path.write_text(model_config({"half_plus_three": three}))  # full replacement
            wait_for_states(stub, "half_plus_three", {123: "AVAILABLE"})
            wait_for_states(stub, "half_plus_two", {124: "END"})
        node.wait_for_log(r"^INFO tfscache\.node\.manager: unloaded half_plus_two version 124 in \d+\.\d{3} s; "
                          r"rss=\d+$")
        node.config_path.write_text("garbage")  # errors of the poller are only logged
        node.wait_for_log(r"^ERROR tfscache\.modelserver\.main: Failed to reload the model config file .*"
                          r"Error parsing text-format")
        assert node.returncode is None
    finally:
        assert node.stop() == 0


def test_a_socket_path_that_cannot_be_bound_fails_the_start(tmp_path, test_models):
    result = run_node("--port=0", "--model_name=half_plus_two",
                      f"--model_base_path={test_models / 'half_plus_two'}",
                      f"--grpc_socket_path={tmp_path / 'no-such-dir' / 'grpc.sock'}")
    assert result.returncode == 1
    assert "ERROR tfscache.modelserver.grpc_api: Failed to bind the gRPC server to unix:" in result.stderr
    assert result.stderr.rstrip().endswith(
        "Failed to start server. Error: INVALID_ARGUMENT: Failed to BuildAndStart gRPC server"), result.stderr
