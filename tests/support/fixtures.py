"""Module-scoped fixtures that a test module adopts under its own names:

    from support import fixtures

    channel = fixtures.channel_to("serve")   # a gRPC channel to this module's `serve` fixture
    stub = fixtures.prediction_stub          # PredictionService over `channel`
    model_stub = fixtures.model_stub         # ModelService over `channel`
    default = fixtures.stub_on("default_node")  # PredictionService on a channel of its own

    gate_dir = fixtures.gate_dir             # files here hold or fail the node's loads
    node = fixtures.gated_node               # a node with no models, its loads gated by gate_dir

pytest registers a fixture under the module attribute that holds it, so each module picks
its own names; a fixture adopted by several modules is still one instance per module.
``channel_to`` and ``stub_on`` take the name of the module's server fixture (a
``support.process.ServerProcess``: `tfscache serve` or `tfscache node`). The stubs import
tensorflow_serving when used, so adopting ``gated_node`` alone does not import tensorflow.
"""

from __future__ import annotations

import grpc
import pytest

from support.node import start_node


def channel_to(server: str):
    """A fixture: a gRPC channel to the server the fixture named ``server`` started."""

    @pytest.fixture(scope="module")
    def channel(request):
        with grpc.insecure_channel(request.getfixturevalue(server).grpc_target) as channel:
            yield channel

    return channel


def stub_on(server: str):
    """A fixture: a PredictionService stub on a channel of its own to the fixture named ``server``."""

    @pytest.fixture(scope="module")
    def stub(request):
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        with grpc.insecure_channel(request.getfixturevalue(server).grpc_target) as channel:
            yield prediction_service_pb2_grpc.PredictionServiceStub(channel)

    return stub


@pytest.fixture(scope="module")
def prediction_stub(channel):
    """A PredictionService stub over the module's ``channel``."""
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def model_stub(channel):
    """A ModelService stub over the module's ``channel``."""
    from tensorflow_serving.apis import model_service_pb2_grpc

    return model_service_pb2_grpc.ModelServiceStub(channel)


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory):
    """The --load_gate_dir of ``gated_node``: ``NAME.hold`` holds NAME's loads, ``NAME.fail`` fails them."""
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def gated_node(tmp_path_factory, gate_dir):
    """A node with no models, no load retries and two load threads, its loads gated by ``gate_dir``."""
    with start_node(tmp_path_factory.mktemp("node"), config="model_config_list {}\n",
                    flags=["--max_num_load_retries=0", "--num_load_threads=2",
                           f"--load_gate_dir={gate_dir}"]) as process:
        yield process
