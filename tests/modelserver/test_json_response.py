"""Unit tests of tfscache.modelserver.json_response against TF Serving's util/json_tensor.cc.

Expected texts follow util/json_tensor_test.cc and
model_servers/http_rest_api_handler_test.cc (tensorflow/serving @9d981c5c): byte
for byte what TF Serving's rapidjson PrettyWriter produces.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from google.protobuf import text_format
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    regression_pb2,
)

from tfscache.errors import InvalidArgument
from tfscache.modelserver import json_response as jr
from tfscache.modelserver.json_tensor import JsonFormat


def tensor(text: str) -> tensor_pb2.TensorProto:
    return text_format.Parse(text, tensor_pb2.TensorProto())


def float_tensor(values: list[float], dims: list[int], dtype: int = types_pb2.DT_FLOAT
                 ) -> tensor_pb2.TensorProto:
    proto = tensor_pb2.TensorProto(dtype=dtype)
    for size in dims:
        proto.tensor_shape.dim.add(size=size)
    (proto.float_val if dtype == types_pb2.DT_FLOAT else proto.double_val).extend(values)
    return proto


def test_predict_response_row_and_columnar_single_output() -> None:
    y = float_tensor([3.0, 3.5, 4.0], [3])
    # Byte for byte what TF Serving's PrettyWriter produces.
    assert jr.predict_json({"y": y}, JsonFormat.ROW) == (
        '{\n    "predictions": [3.0, 3.5, 4.0\n    ]\n}')
    assert jr.predict_json({"y": y}, JsonFormat.COLUMNAR) == (
        '{\n    "outputs": [\n        3.0,\n        3.5,\n        4.0\n    ]\n}')
    y2 = float_tensor([2.5, 3, 3.5, 4], [2, 2])
    assert json.loads(jr.predict_json({"y": y2}, JsonFormat.ROW)) == {"predictions": [[2.5, 3.0], [3.5, 4.0]]}
    assert jr.predict_json({"y": y2}, JsonFormat.ROW) == (
        '{\n    "predictions": [[2.5, 3.0], [3.5, 4.0]\n    ]\n}')


def test_predict_response_multiple_outputs_and_types() -> None:
    outputs = {
        "float": float_tensor([1, 2], [2]),
        "int": tensor("dtype: DT_INT32 tensor_shape { dim { size: 2 } } int_val: [3, -4]"),
        "str": tensor('dtype: DT_STRING tensor_shape { dim { size: 2 } } string_val: ["a", "b\\""]'),
        "str_bytes": tensor('dtype: DT_STRING tensor_shape { dim { size: 2 } dim { size: 1 } } '
                            'string_val: ["hello", "world"]'),
        "flag": tensor("dtype: DT_BOOL tensor_shape { dim { size: 2 } } bool_val: [true, false]"),
        "i64": tensor("dtype: DT_INT64 tensor_shape { dim { size: 2 } } int64_val: [9007199254740993, 0]"),
    }
    row = jr.predict_json(outputs, JsonFormat.ROW)
    assert json.loads(row) == {"predictions": [
        {"flag": True, "float": 1.0, "i64": 9007199254740993, "int": 3, "str": "a",
         "str_bytes": [{"b64": "aGVsbG8="}]},
        {"flag": False, "float": 2.0, "i64": 0, "int": -4, "str": 'b"',
         "str_bytes": [{"b64": "d29ybGQ="}]}]}
    assert '"i64": 9007199254740993' in row and '"float": 1.0' in row
    columnar = json.loads(jr.predict_json(outputs, JsonFormat.COLUMNAR))
    assert columnar == {"outputs": {
        "flag": [True, False], "float": [1.0, 2.0], "i64": [9007199254740993, 0], "int": [3, -4],
        "str": ["a", 'b"'], "str_bytes": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}}


def test_predict_response_errors_and_empty_batch() -> None:
    with pytest.raises(InvalidArgument, match="^Cannot convert empty tensor map to JSON$"):
        jr.predict_json({}, JsonFormat.ROW)
    scalar = float_tensor([3.0], [])
    with pytest.raises(InvalidArgument) as caught:
        jr.predict_json({"y": scalar}, JsonFormat.ROW)
    assert caught.value.message == "Tensor name: y has no shape information "
    assert jr.predict_json({"y": scalar}, JsonFormat.COLUMNAR) == '{\n    "outputs": 3.0\n}'
    with pytest.raises(InvalidArgument) as caught:
        jr.predict_json({"a": float_tensor([1, 2], [2]), "b": float_tensor([1], [1])}, JsonFormat.ROW)
    assert caught.value.message == "Tensor name: b has inconsistent batch size: 1 expecting: 2"
    assert json.loads(jr.predict_json({"y": float_tensor([], [0, 3])}, JsonFormat.ROW)) == {"predictions": []}
    half = tensor("dtype: DT_HALF tensor_shape { dim { size: 1 } } half_val: 15360")
    with pytest.raises(InvalidArgument) as caught:
        jr.predict_json({"h": half}, JsonFormat.ROW)
    assert caught.value.message == "Failed to write JSON value for tensor type: half"


@pytest.mark.parametrize("value, dtype, text", [
    (3.0, types_pb2.DT_FLOAT, "3.0"),
    (0.2, types_pb2.DT_FLOAT, "0.2"),  # no float->double noise
    (9000000.0, types_pb2.DT_FLOAT, "9e+06"),
    (0.00003, types_pb2.DT_FLOAT, "3e-05"),
    (1435774336.0, types_pb2.DT_FLOAT, "1.43577434e+09"),
    (1 / 3, types_pb2.DT_FLOAT, "0.333333343"),
    (1 / 3, types_pb2.DT_DOUBLE, "0.33333333333333331"),
    (-0.0, types_pb2.DT_FLOAT, "-0.0"),
    (math.nan, types_pb2.DT_FLOAT, "NaN"),
    (math.inf, types_pb2.DT_DOUBLE, "Infinity"),
    (-math.inf, types_pb2.DT_FLOAT, "-Infinity"),
])
def test_float_formatting(value: float, dtype: int, text: str) -> None:
    assert jr.predict_json({"y": float_tensor([value], [], dtype)}, JsonFormat.COLUMNAR) == (
        '{\n    "outputs": ' + text + "\n}")


def test_classification_and_regression_results() -> None:
    result = classification_pb2.ClassificationResult()
    classes = result.classifications.add().classes
    classes.add(label="", score=3.0)
    classes.add(label="b", score=0.5)
    result.classifications.add().classes.add(label="c", score=1.0)
    assert jr.classification_json(result) == (
        '{\n    "results": [[["", 3.0], ["b", 0.5]], [["c", 1.0]]\n    ]\n}')
    regression = regression_pb2.RegressionResult()
    for value in (0.2, math.inf, 1.0, -math.inf, math.nan):
        regression.regressions.add(value=value)
    assert jr.regression_json(regression) == (
        '{\n    "results": [0.2, Infinity, 1.0, -Infinity, NaN]\n}')
    with pytest.raises(InvalidArgument, match="^Cannot convert empty ClassificationResults to JSON$"):
        jr.classification_json(classification_pb2.ClassificationResult())
    with pytest.raises(InvalidArgument, match="^Cannot convert empty RegressionResults to JSON$"):
        jr.regression_json(regression_pb2.RegressionResult())


def test_error_json() -> None:
    assert jr.error_json('Bad key: "key"') == '{\n    "error": "Bad key: \\"key\\""\n}'
    assert json.loads(jr.error_json("a\nb\x01")) == {"error": "a\nb\x01"}


def test_status_json() -> None:
    response = get_model_status_pb2.GetModelStatusResponse()
    response.model_version_status.add(version=123, state=30)
    assert json.loads(jr.status_json(response)) == {"model_version_status": [
        {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    failed = response.model_version_status.add(version=124, state=50)
    failed.status.error_code = 5
    failed.status.error_message = "gone"
    assert json.loads(jr.status_json(response))["model_version_status"][1] == {
        "version": "124", "state": "END", "status": {"error_code": "NOT_FOUND", "error_message": "gone"}}


def test_metadata_json() -> None:
    signatures = get_model_metadata_pb2.SignatureDefMap()
    signature = signatures.signature_def["serving_default"]
    signature.method_name = "tensorflow/serving/predict"
    signature.inputs["x"].name = "x:0"
    signature.inputs["x"].dtype = types_pb2.DT_FLOAT
    signature.inputs["x"].tensor_shape.dim.add(size=-1)
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = "default"
    response.model_spec.version.value = 123
    response.metadata["signature_def"].Pack(signatures)
    doc = json.loads(jr.metadata_json(response))
    assert doc["model_spec"] == {"name": "default", "signature_name": "", "version": "123"}
    sig = doc["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict" and sig["defaults"] == {}
    assert sig["inputs"]["x"] == {"dtype": "DT_FLOAT", "name": "x:0", "tensor_shape": {
        "dim": [{"size": "-1", "name": ""}], "unknown_rank": False}}


@pytest.mark.parametrize("dtype", [types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE])
def test_bulk_float_formatting_matches_value_by_value(dtype: int) -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate([
        rng.random(500), rng.normal(scale=1e6, size=200), rng.integers(-1000, 1000, 200),
        [0.0, -0.0, 0.1, 0.2, 1e-5, 9e6, 1e30, 1e-30, math.nan, math.inf, -math.inf, 3.0, 2.5]])
    array = values.astype(np.float32 if dtype == types_pb2.DT_FLOAT else np.float64)
    double = dtype == types_pb2.DT_DOUBLE
    assert jr._float_tokens(array, double) == [jr._decimal(v, double) for v in array.tolist()]
