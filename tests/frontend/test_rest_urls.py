"""TF Serving's REST URL dispatch, as the front end reads it for routing."""

from __future__ import annotations

import json

import pytest

from tfscache import errors
from tfscache.frontend.protocols.tfserving.methods import RouteKey
from tfscache.frontend.protocols.tfserving.rest import error_response, parse_url


@pytest.mark.parametrize("method, path, key, verb", [
    ("POST", "/v1/models/m:predict", RouteKey("m"), "predict"),
    ("POST", "/v1/models/m:classify", RouteKey("m"), "classify"),
    ("POST", "/v1/models/m:regress", RouteKey("m"), "regress"),
    ("POST", "/v1/models/m/versions/123:predict", RouteKey("m", version=123), "predict"),
    ("POST", "/v1/models/m/labels/stable:predict", RouteKey("m", label="stable"), "predict"),
    ("POST", "/V1/MODELS/m:predict", RouteKey("m"), "predict"),
    ("POST", "/v1/models/a%20b%2Fc:predict", RouteKey("a b/c"), "predict"),
    ("GET", "/v1/models/m", RouteKey("m"), "status"),
    ("GET", "/v1/models/m/versions/00000123", RouteKey("m", version=123), "status"),
    ("GET", "/v1/models/m/labels/canary", RouteKey("m", label="canary"), "status"),
    ("GET", "/v1/models/m/metadata", RouteKey("m"), "metadata"),
    ("GET", "/v1/models/m/versions/7/metadata", RouteKey("m", version=7), "metadata"),
])
def test_urls_route(method, path, key, verb):
    route = parse_url(method, path)
    assert (route.key, route.verb) == (key, verb)


@pytest.mark.parametrize("method, path", [
    ("POST", "/v1/models/m:PREDICT"),          # the regex is case-insensitive, dispatch is not
    ("POST", "/v1/models/m:explain"),
    ("POST", "/v1/models/m"),
    ("GET", "/v1/models/m:predict"),
    ("PUT", "/v1/models/m:predict"),
    ("DELETE", "/v1/models/m"),
    ("POST", "/v1/models/m/versions/x:predict"),
    ("GET", "/v1/models/m/versions/1/labels/a"),
    ("GET", "/v1/models/m/METADATA"),
])
def test_malformed_urls(method, path):
    with pytest.raises(errors.InvalidArgument) as info:
        parse_url(method, path)
    assert info.value.message == f"Malformed request: {method} {path}"


def test_missing_model_name_and_version_overflow():
    with pytest.raises(errors.InvalidArgument, match=r"^Missing model name in request\.$"):
        parse_url("GET", "/v1/models")
    with pytest.raises(errors.InvalidArgument) as info:
        parse_url("POST", "/v1/models/m/versions/99999999999999999999:predict")
    assert info.value.message == "Failed to convert version: 99999999999999999999 to numeric."


def test_error_body_is_tf_servings():
    response = error_response(errors.ModelNotFound("Servable not found for request: Latest(half)"))
    assert response.status == 404
    assert response.content_type == "application/json"
    assert json.loads(response.text) == {"error": "Servable not found for request: Latest(half)"}
