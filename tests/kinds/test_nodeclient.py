"""NodeClient against a real ``tfscache node``: messages, deadlines, error translation."""

from __future__ import annotations

import grpc
import pytest

from support import fixtures
from tfscache import errors
from tfscache.kinds.tfserving.client import AVAILABLE, END, NodeClient
from tfscache.wire import serving_pb2 as pb


gate_dir = fixtures.gate_dir
node = fixtures.gated_node


@pytest.fixture(scope="module")
def models(synthetic_models):
    return {path.name: path for path in synthetic_models([21, 22, 23])}


@pytest.fixture
async def client(node):
    client = NodeClient(node.grpc_target, rpc_deadline_s=30.0)
    yield client
    await client.close()


def config(*models: tuple[str, object], versions=(1,)) -> pb.ModelServerConfig:
    result = pb.ModelServerConfig()
    result.model_config_list.SetInParent()
    for name, base_path in models:
        entry = result.model_config_list.config.add(name=name, base_path=str(base_path),
                                                    model_platform="tensorflow")
        entry.model_version_policy.specific.versions.extend(versions)
    return result


async def test_reload_then_status(client, models):
    await client.reload(config(("addk_21", models["addk_21"])))
    [status] = await client.status("addk_21")
    assert (status.version, status.state, status.status.error_code) == (1, AVAILABLE, 0)
    assert [s.version for s in await client.status("addk_21", 1)] == [1]
    await client.reload(config())
    assert await client.status("never_heard_of") == []
    assert await client.status("addk_21", 5) == []  # "Could not find version 5 of model addk_21"


async def test_unset_config_is_invalid_argument_with_tf_serving_text(client):
    with pytest.raises(errors.InvalidArgument) as info:
        await client.reload(pb.ModelServerConfig())
    assert info.value.message == ("ServerModelConfig type not supported by HandleReloadConfigRequest. "
                                  "Only ModelConfigList is currently supported")


async def test_invalid_configs_keep_tf_serving_messages(client, models):
    with pytest.raises(errors.InvalidArgument) as info:
        await client.reload(config(("addk_21", models["addk_21"]), ("addk_21", models["addk_21"])))
    assert info.value.grpc_code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message == "Illegal to list model addk_21 multiple times in config list"
    with pytest.raises(errors.InvalidArgument) as info:
        await client.reload(config(("rel", "relative/path")))
    assert info.value.message == ("Expected model rel to have an absolute path or URI; "
                                  "got base_path()=relative/path")


async def test_failed_load_is_unknown_and_status_has_the_load_error(client, models, gate_dir):
    (gate_dir / "addk_22.fail").touch()
    try:
        with pytest.raises(errors.Unknown) as info:
            await client.reload(config(("addk_22", models["addk_22"])))
        assert info.value.message == ("1 model(s) did not become available: {{{name: addk_22 version: 1} "
                                      "due to error: INTERNAL: injected load failure for addk_22}, }")
        [status] = await client.status("addk_22")
        assert status.state == END
        assert (status.status.error_code, status.status.error_message) == (
            grpc.StatusCode.INTERNAL.value[0], "injected load failure for addk_22")
    finally:
        (gate_dir / "addk_22.fail").unlink()
        await client.reload(config())


async def test_reload_past_its_deadline_is_deadline_exceeded(client, models, gate_dir):
    (gate_dir / "addk_23.hold").touch()
    try:
        with pytest.raises(errors.DeadlineExceeded) as info:
            await client.reload(config(("addk_23", models["addk_23"])), deadline_s=0.3)
        assert info.value.grpc_code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert isinstance(info.value.__cause__, grpc.aio.AioRpcError)
    finally:
        (gate_dir / "addk_23.hold").unlink()
    await client.reload(config(("addk_23", models["addk_23"])))  # the node's reload finishes
    await client.reload(config())


async def test_unreachable_node_is_node_unavailable(tmp_path):
    target = f"unix:{tmp_path}/nobody-listens.sock"
    client = NodeClient(target, rpc_deadline_s=5.0)
    try:
        with pytest.raises(errors.NodeUnavailable) as info:
            await client.status("m")
        assert info.value.grpc_code == grpc.StatusCode.UNAVAILABLE
        assert info.value.message.startswith(f"node {target} is unavailable: ")
        with pytest.raises(errors.NodeUnavailable):
            await client.reload(config())
    finally:
        await client.close()
