"""Version labels across sidecars: the sidecar a request enters resolves the label, and the
owner it forwards to serves the labelled version (two real nodes, sidecars in-process)."""

from __future__ import annotations

import json
import shutil

import aiohttp
import grpc
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.requests import predict_request
from support.sidecars import running_sidecars
from tfscache.cluster.ring import Ring


@pytest.fixture(scope="module")
def labelled_repo(test_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("sidecar-labels") / "models"
    shutil.copytree(test_models / "half_plus_two", root / "half_plus_two")
    (root / "half_plus_two" / "labels.json").write_text(json.dumps({"stable": 123, "canary": 124}))
    return root


@pytest.fixture
async def sidecars(nodes, labelled_repo, tmp_path):
    async with running_sidecars(nodes, labelled_repo, tmp_path) as apps:
        yield apps


@pytest.mark.parametrize(("label", "version"), [("stable", 123), ("canary", 124)])
async def test_a_label_request_entering_a_non_owner_is_served_by_the_owner(sidecars, label, version):
    owner = Ring(["a", "b"]).owner("half_plus_two")
    other = "a" if owner == "b" else "b"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecars[other].grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = await stub.Predict(predict_request("half_plus_two", label=label), timeout=60)
        assert (response.model_spec.name, response.model_spec.version.value) == ("half_plus_two", version)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Predict(predict_request("half_plus_two", label="nope"), timeout=60)
        assert (info.value.code(), info.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: nope")
    assert sidecars[owner].backends[owner].cache.is_resident("half_plus_two", version)
    assert not sidecars[other].backends[other].cache.is_resident("half_plus_two", version)
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{sidecars[other].rest_port}/v1/models/half_plus_two/labels/{label}/metadata"
        async with http.get(url) as reply:
            assert reply.status == 200
            body = await reply.json()
    assert body["model_spec"]["version"] == str(version)
