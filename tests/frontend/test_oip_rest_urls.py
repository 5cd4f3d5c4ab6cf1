"""The Open Inference Protocol's REST URL dispatch (Triton's http_server.cc patterns), as the
front end reads it for routing."""

from __future__ import annotations

import json

import pytest

from tfscache import errors
from tfscache.frontend.protocols.tfserving.methods import RouteKey
from tfscache.frontend.protocols.oip.methods import REPOSITORY_REFUSED
from tfscache.frontend.protocols.oip.rest import OipRoute, error_response, parse_url


@pytest.mark.parametrize("path, method, http_method, key", [
    ("/v2", "ServerMetadata", "GET", None),
    ("/v2/health/live", "ServerLive", "GET", None),
    ("/v2/health/ready", "ServerReady", "GET", None),
    ("/v2/models/stats", "ModelStatistics", "GET", None),
    ("/v2/models/m", "ModelMetadata", "GET", RouteKey("m")),
    ("/v2/models/m/versions/3", "ModelMetadata", "GET", RouteKey("m", version=3)),
    ("/v2/models/m/ready", "ModelReady", "GET", RouteKey("m")),
    ("/v2/models/m/versions/007/ready", "ModelReady", "GET", RouteKey("m", version=7)),
    ("/v2/models/m/config", "ModelConfig", "GET", RouteKey("m")),
    ("/v2/models/m/stats", "ModelStatistics", "GET", RouteKey("m")),
    ("/v2/models/m/infer", "ModelInfer", "POST", RouteKey("m")),
    ("/v2/models/m/versions/2/infer", "ModelInfer", "POST", RouteKey("m", version=2)),
    ("/v2/models/m/generate", "ModelGenerate", "POST", RouteKey("m")),
    ("/v2/models/a%20b/infer", "ModelInfer", "POST", RouteKey("a b")),
    ("/v2/models/stats/ready", "ModelReady", "GET", RouteKey("stats")),
])
def test_urls_route(path, method, http_method, key):
    route = parse_url(path)
    assert (route.method, route.http_method, route.key) == (method, http_method, key)


@pytest.mark.parametrize("path", [
    "/", "/v1/models/m", "/v2/", "/v2/health", "/v2/health/alive", "/v2/models", "/v2/models/",
    "/v2/models/m/versions/x/infer",  # a version that is not digits does not match (measured: 404)
    "/v2/models/m/predict", "/v2/models/m/versions/1/labels/a", "/V2/models/m/infer",
])
def test_unmatched_urls_are_not_found(path):
    with pytest.raises(errors.NotFound) as info:
        parse_url(path)
    assert info.value.message == "Not Found"


@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/repository/models/m/load",
                                  "/v2/repository/models/m/unload", "/v2/repository/r/index"])
def test_repository_api_is_refused(path):
    with pytest.raises(errors.FailedPrecondition) as info:
        parse_url(path)
    assert info.value.message == REPOSITORY_REFUSED


def test_generate_stream_is_served():
    assert parse_url("/v2/models/m/versions/3/generate_stream") == OipRoute("ModelGenerateStream", "POST",
                                                                           RouteKey("m", version=3))


@pytest.mark.parametrize("path", ["/v2/models/m/trace/setting",
                                  "/v2/systemsharedmemory/status", "/v2/cudasharedmemory/region/r/register",
                                  "/v2/trace/setting", "/v2/logging"])
def test_per_node_apis_are_not_served(path):
    with pytest.raises(errors.Unimplemented):
        parse_url(path)


def test_version_overflow_is_tritons_invalid_argument():
    with pytest.raises(errors.InvalidArgument) as info:
        parse_url("/v2/models/m/versions/99999999999999999999/infer")
    assert info.value.message == ("failed to get model version from specified version string "
                                  "'99999999999999999999' (details: stol), version should be an integral value > 0")


def test_error_body_is_tritons():
    response = error_response(404, "Request for unknown model: 'x' is not found")
    assert response.status == 404 and response.content_type == "application/json"
    assert response.text == '{"error":"Request for unknown model: \'x\' is not found"}'
    assert json.loads(response.text) == {"error": "Request for unknown model: 'x' is not found"}
