"""`tfscache serve` start-up: bad settings stop it with the field and value; --node-command."""

from __future__ import annotations

import os
import signal
import subprocess

import grpc
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.serving import serve_command, start_serve
from support.node import PYTHON, REPO
from support.requests import predict_request


@pytest.mark.parametrize("args, message", [
    (["--memory-per-node", "4XB"], "tfscache serve: bad value for setting cache.memory_per_node: '4XB' "
                                   "(expected bytes, e.g. 4GiB, 512MiB or 1000000)"),
    (["--local-nodes", "0"], "tfscache serve: bad value for setting node.local_nodes: 0 "
                             "(must be >= 1 without --node-address)"),
    (["--grpc-port", "8500", "--rest-port", "8500"],
     "tfscache serve: bad value for setting server.rest_port: 8500 (must differ from server.grpc_port)"),
])
def test_bad_value_stops_start_up_naming_field_and_value(tmp_path, args, message):
    result = subprocess.run(serve_command(["--model-repository", str(tmp_path), *args]), cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == message


def test_bad_environment_value(tmp_path):
    result = subprocess.run(serve_command(["--model-repository", str(tmp_path)]), cwd=REPO, capture_output=True,
                            text=True, timeout=60, env={"TFSCACHE_RING_REPLICAS_PER_MODEL": "many"})
    assert result.returncode == 2
    assert result.stderr.strip() == ("tfscache serve: bad value for setting ring.replicas_per_model: 'many' "
                                     "(expected int)")


def test_help_lists_the_flags():
    result = subprocess.run(serve_command(["--help"]), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ("--model-repository", "--local-nodes", "--max-models-per-node", "--memory-per-node",
                 "--replicas-per-model", "--grpc-port", "--rest-port", "--config", "--node-address",
                 "--node-command"):
        assert flag in result.stdout


def test_output_into_a_closed_pipe_ends_quietly_as_sigpipe_would():
    # `tfscache node --help | head -1`: a reader that went away before the output was written
    for command in (["--version"], ["node", "--help"]):
        read, write = os.pipe()
        os.close(read)  # no reader at all, from the start: the first write fails
        try:
            result = subprocess.run([PYTHON, "-m", "tfscache", *command], cwd=REPO, stdout=write,
                                    stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(write)
        assert result.returncode == 128 + signal.SIGPIPE, (command, result.stderr)
        assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr


def test_node_command_runs_a_server_without_ports_file(frontend_repo, tmp_path):
    # `tfscache node` given only tensorflow_model_server's flags stands in for the real binary:
    # serve chooses its ports and waits for them to accept connections.
    with start_serve(tmp_path, frontend_repo, "--local-nodes", "1",
                     "--node-command", f"{PYTHON} -m tfscache node") as serve:
        with grpc.insecure_channel(serve.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            response = stub.Predict(predict_request("addk_3", 1.0), timeout=120)
        assert list(response.outputs["y"].float_val) == [4.0]
        assert "--ports_file" not in serve.log_text().split("starting node0:", 1)[1].splitlines()[0]
