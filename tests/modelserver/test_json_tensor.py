"""Unit tests of tfscache.modelserver.json_tensor against TF Serving's util/json_tensor.cc.

Cases and expected texts follow util/json_tensor_test.cc and
model_servers/http_rest_api_handler_test.cc (tensorflow/serving @9d981c5c), with
rapidjson's parse-error texts and offsets.
"""

from __future__ import annotations

import json
import math

import pytest
from google.protobuf import text_format
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import classification_pb2, regression_pb2

from tfscache.errors import InvalidArgument, Unimplemented
from tfscache.modelserver import json_tensor as jt
from tfscache.modelserver.json_examples import fill_example_request
from tfscache.modelserver.json_tensor import JsonFormat
from tfscache.modelserver import rapidjson_reader
from tfscache.modelserver.rapidjson_reader import ParseError, Parser
from tfscache.modelserver.rapidjson_writer import debug_string


def infos(**dtypes: int) -> dict[str, meta_graph_pb2.TensorInfo]:
    return {name: meta_graph_pb2.TensorInfo(dtype=dtype) for name, dtype in dtypes.items()}


def tensor(text: str) -> tensor_pb2.TensorProto:
    return text_format.Parse(text, tensor_pb2.TensorProto())


def fill(body: str, **dtypes: int) -> tuple[dict[str, tensor_pb2.TensorProto], JsonFormat]:
    doc = jt.parse_json(body.encode())
    return jt.predict_inputs(doc, infos(**dtypes), jt.signature_name(doc))


def fill_error(body: str, **dtypes: int) -> str:
    with pytest.raises(InvalidArgument) as caught:
        fill(body, **dtypes)
    return caught.value.message


# -- parsing ---------------------------------------------------------------------------

@pytest.mark.parametrize("body, message", [
    (b"", "JSON Parse error: The document is empty"),
    (b"  \n", "JSON Parse error: The document is empty. at offset: 3"),
    (b"instances = [1, 2]", "JSON Parse error: Invalid value. at offset: 0"),
    (b'{"instances": [1,', "JSON Parse error: Invalid value. at offset: 17"),
    (b'{"instances": [1', "JSON Parse error: Missing a comma or ']' after an array element. at offset: 16"),
    (b'{"a" 1}', "JSON Parse error: Missing a colon after a name of object member. at offset: 5"),
    (b'{"a": 1 "b": 2}', "JSON Parse error: Missing a comma or '}' after an object member. at offset: 8"),
    (b'{1: 2}', "JSON Parse error: Missing a name for object member. at offset: 1"),
    (b'{"a": 1,}', "JSON Parse error: Missing a name for object member. at offset: 8"),
    (b'{"a": [1,]}', "JSON Parse error: Invalid value. at offset: 9"),
    (b'{"a": tru}', "JSON Parse error: Invalid value. at offset: 9"),
    (b'{"a": 1.}', "JSON Parse error: Miss fraction part in number. at offset: 8"),
    (b'{"a": 1e+}', "JSON Parse error: Miss exponent in number. at offset: 9"),
    (b'{"a": 1e400}', "JSON Parse error: Number too big to be stored in double. at offset: 6"),
    (b'{"a": [0e400]}', "JSON Parse error: Number too big to be stored in double. at offset: 7"),
    (b'{"a": "x\\q"}', "JSON Parse error: Invalid escape character in string. at offset: 8"),
    (b'{"a": "\\u12G4"}', "JSON Parse error: Incorrect hex digit after \\u escape in string. at offset: 7"),
    (b'{"a": "x\ny"}', "JSON Parse error: Invalid encoding in string. at offset: 8"),
    (b'{"a": "abc', "JSON Parse error: Missing a closing quotation mark in string. at offset: 10"),
    (b'{"a": Infinit}', "JSON Parse error: Invalid value. at offset: 13"),
    (b"[1, 2]", "JSON Value: [1, 2] Is not object"),
    (b'"text"', 'JSON Value: "text" Is not object'),
])
def test_parse_errors_use_rapidjson_texts_and_offsets(body: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        jt.parse_json(body)
    assert caught.value.message == message


def test_rapidjson_parser_rejects_broken_surrogate_pairs() -> None:
    # Both the library and the fallback parser (for non-UTF-8 and deep documents).
    for parser in (rapidjson_reader.parse, lambda data: Parser(data).parse()):
        with pytest.raises(ParseError) as caught:
            parser(b'{"a": "\\uD800x"}')
        assert (caught.value.message, caught.value.offset) == (
            "The surrogate pair in string is invalid.", 7)


@pytest.mark.parametrize("body, message", [
    # not UTF-8: python-rapidjson cannot decode it, the fallback parser reads it
    (b'{"a": "\xff", "b": [1,]}', "JSON Parse error: Invalid value. at offset: 19"),
    # deeper than python-rapidjson's recursion limit
    (b'{"a": ' + b"[" * 5000 + b"1 2", "JSON Parse error: Missing a comma or ']' after an array element. at offset: 5008"),
    (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b", }", "JSON Parse error: Missing a name for object member. at offset: 10008"),
    # the document ends at the first NUL, as a C string does
    (b'{"a": "b\0c"}', "JSON Parse error: Missing a closing quotation mark in string. at offset: 8"),
])
def test_documents_the_library_cannot_read_get_rapidjson_errors(body: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        jt.parse_json(body)
    assert caught.value.message == message


def test_bytes_that_are_not_utf8_pass_through() -> None:
    doc = jt.parse_json(b'{"instances": ["\xff\xfe"]} \0 trailing')
    tensors, _ = jt.predict_inputs(doc, infos(default=types_pb2.DT_STRING))
    assert list(tensors["default"].string_val) == [b"\xff\xfe"]


def test_parse_accepts_what_rapidjson_accepts() -> None:
    # kParseNanAndInfFlag spellings, and kParseStopWhenDoneFlag: bytes after the root are ignored.
    assert jt.parse_json(b'{"a": [0.001e310, 1e-400]}') == {"a": [1e307, 0.0]}
    doc = jt.parse_json(b'{"a": [NaN, Inf, -Inf, Infinity, -Infinity, 1]} trailing {')
    assert math.isnan(doc["a"][0]) and doc["a"][1:5] == [math.inf, -math.inf, math.inf, -math.inf]
    assert jt.parse_json(b' {"a": "\\u00e9\\ud83d\\ude00"}') == {"a": "\u00e9\U0001F600"}
    # DeeplyNestedWellFormed: 500000 nested arrays parse (python-rapidjson would recurse too deep).
    deep = b'{"instances":[1], "nested":' + b"[" * 500000 + b"]" * 500000 + b"}"
    tensors, fmt = jt.predict_inputs(jt.parse_json(deep), infos(default=types_pb2.DT_INT32))
    assert fmt is JsonFormat.ROW and list(tensors["default"].int_val) == [1]


def test_integers_too_wide_for_64_bits_are_doubles() -> None:
    doc = jt.parse_json(b'{"a": 18446744073709551616, "b": 18446744073709551615}')
    assert doc == {"a": 18446744073709551616.0, "b": 18446744073709551615}
    assert isinstance(Parser(b"[18446744073709551616]").parse()[0], float)
    assert rapidjson_reader.parse(b"[-9223372036854775809, -9223372036854775808]") == [
        -9223372036854775809.0, -(2**63)]
    assert type(rapidjson_reader.parse(b"[-9223372036854775809]")[0]) is float


def test_signature_name_must_be_a_string() -> None:
    with pytest.raises(InvalidArgument) as caught:
        jt.signature_name(jt.parse_json(b'{ "signature_name": 100 }'))
    assert caught.value.message == (
        'JSON Value: {\n    "signature_name": 100\n} not formatted correctly. '
        "'signature_name' key must be a string value.")
    assert jt.signature_name({"signature_name": "s"}) == "s"
    assert jt.signature_name({}) == ""


def test_deeply_nested_signature_name_error_is_cut_at_256_bytes() -> None:
    deep = b'{"signature_name":' + b"[" * 500000 + b"]" * 500000 + b"}"
    with pytest.raises(InvalidArgument) as caught:
        jt.signature_name(jt.parse_json(deep))
    message = caught.value.message
    assert message.endswith(" not formatted correctly. 'signature_name' key must be a string value.")
    assert len(message.split(" not formatted")[0]) == len("JSON Value: ") + 256


@pytest.mark.parametrize("value, text", [
    (2.0, "2.0"), (0.1, "0.1"), (-1.5, "-1.5"), (1e21, "1e21"), (1e20, "100000000000000000000.0"),
    (1.5e-7, "1.5e-7"), (1e-6, "0.000001"), (123456.789, "123456.789"), (-0.0, "-0.0"),
    (1.2345e30, "1.2345e30"),
])
def test_debug_strings_write_doubles_like_rapidjson(value: float, text: str) -> None:
    assert debug_string(value) == text


def test_debug_string_layout_and_nan() -> None:
    assert debug_string({"a": [1, "x", None, True], "b": {}}) == (
        '{\n    "a": [1, "x", null, true],\n    "b": {}\n}')
    # rapidjson's Writer refuses NaN: the debug string stops after the separator.
    assert debug_string([1, math.nan, 2]) == "[1, "


# -- Predict: row format ---------------------------------------------------------------

def test_single_unnamed_tensor() -> None:
    tensors, fmt = fill('{"instances": [[1,2],[3,4],[5,6]]}', default=types_pb2.DT_INT32)
    assert fmt is JsonFormat.ROW
    assert tensors["default"] == tensor(
        "dtype: DT_INT32 tensor_shape { dim { size: 3 } dim { size: 2 } } "
        "int_val: [1, 2, 3, 4, 5, 6]")


def test_mixed_numbers_for_float_and_double() -> None:
    tensors, _ = fill('{"instances": [1, 2.0, 3, 5.003, 0.007, 0.0]}', default=types_pb2.DT_FLOAT)
    assert tensors["default"] == tensor(
        "dtype: DT_FLOAT tensor_shape { dim { size: 6 } } float_val: [1, 2, 3, 5.003, 0.007, 0]")
    tensors, _ = fill('{"instances": [1.0, 2, 0.662, 0]}', default=types_pb2.DT_DOUBLE)
    assert list(tensors["default"].double_val) == [1.0, 2.0, 0.662, 0.0]


def test_float_overflow_becomes_infinity_and_precision_is_lost() -> None:
    tensors, _ = fill('{"instances": [1.7976931348623157e308, -1.7976931348623157e308, '
                      '1435774380, 2.2250738585072014e-308]}', default=types_pb2.DT_FLOAT)
    assert list(tensors["default"].float_val) == [math.inf, -math.inf, 1435774336.0, 0.0]


def test_signature_name_is_read() -> None:
    doc = jt.parse_json(b'{"signature_name": "predict_images", "instances": [[1,2]]}')
    assert jt.signature_name(doc) == "predict_images"


def test_base64_strings() -> None:
    tensors, _ = fill('{"instances": [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}]}',
                      default=types_pb2.DT_STRING)
    assert tensors["default"] == tensor(
        'dtype: DT_STRING tensor_shape { dim { size: 2 } } string_val: ["hello", "world"]')
    tensors, _ = fill('{"instances": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}',
                      default=types_pb2.DT_STRING)
    assert [d.size for d in tensors["default"].tensor_shape.dim] == [2, 1]
    tensors, _ = fill('{"instances": [{"default": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}]}',
                      default=types_pb2.DT_STRING)
    assert [d.size for d in tensors["default"].tensor_shape.dim] == [1, 2, 1]
    assert list(tensors["default"].string_val) == [b"hello", b"world"]


def test_multiple_named_tensors_with_nan_and_infinity() -> None:
    tensors, fmt = fill("""{"instances": [
        {"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"],
         "float_tensor": [1.0, NaN], "dbl_tensor": [NaN]},
        {"int_tensor": [[7,8],[9,0],[1,2]], "str_tensor": ["baz", "bat"],
         "float_tensor": [2.0, Infinity], "dbl_tensor": [2.0]}]}""",
                        int_tensor=types_pb2.DT_INT32, str_tensor=types_pb2.DT_STRING,
                        float_tensor=types_pb2.DT_FLOAT, dbl_tensor=types_pb2.DT_DOUBLE)
    assert fmt is JsonFormat.ROW
    assert [d.size for d in tensors["int_tensor"].tensor_shape.dim] == [2, 3, 2]
    assert list(tensors["int_tensor"].int_val) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    assert list(tensors["str_tensor"].string_val) == [b"foo", b"bar", b"baz", b"bat"]
    floats = list(tensors["float_tensor"].float_val)
    assert floats[0] == 1.0 and math.isnan(floats[1]) and floats[2:] == [2.0, math.inf]
    assert [d.size for d in tensors["dbl_tensor"].tensor_shape.dim] == [2, 1]


@pytest.mark.parametrize("dtype, field, values", [
    (types_pb2.DT_INT64, "int64_val", [-(2**63), 2**63 - 1]),
    (types_pb2.DT_UINT32, "uint32_val", [0, 2**32 - 1]),
    (types_pb2.DT_UINT64, "uint64_val", [0, 2**64 - 1]),
    (types_pb2.DT_BOOL, "bool_val", [True, False]),
    (types_pb2.DT_INT8, "int_val", [-5, 7]),
])
def test_other_dtypes(dtype: int, field: str, values: list) -> None:
    tensors, _ = fill(json.dumps({"instances": values}), v=dtype)
    assert tensors["v"].dtype == dtype and list(getattr(tensors["v"], field)) == values


# -- Predict: columnar format -----------------------------------------------------------

def test_columnar_single_and_multiple() -> None:
    tensors, fmt = fill('{"inputs": {"int_tensor": [[[1,2],[3,4],[5,6]]]}}', int_tensor=types_pb2.DT_INT32)
    expected = tensor("dtype: DT_INT32 tensor_shape { dim { size: 1 } dim { size: 3 } dim { size: 2 } } "
                      "int_val: [1, 2, 3, 4, 5, 6]")
    assert fmt is JsonFormat.COLUMNAR and tensors["int_tensor"] == expected
    tensors, _ = fill('{"inputs": [[[1,2],[3,4],[5,6]]]}', int_tensor=types_pb2.DT_INT32)
    assert tensors["int_tensor"] == expected
    tensors, _ = fill('{"inputs": {"int_tensor": [[1,2]], "str_tensor": ["foo", "bar"], '
                      '"bin_tensor": {"b64": "aGVsbG8="}, "ignored": 1}}',
                      int_tensor=types_pb2.DT_INT32, str_tensor=types_pb2.DT_STRING,
                      bin_tensor=types_pb2.DT_STRING)
    assert set(tensors) == {"int_tensor", "str_tensor", "bin_tensor"}
    assert tensors["bin_tensor"] == tensor('dtype: DT_STRING tensor_shape {} string_val: "hello"')
    assert tensors["str_tensor"] == tensor(
        'dtype: DT_STRING tensor_shape { dim { size: 2 } } string_val: ["foo", "bar"]')


def test_columnar_scalar() -> None:
    tensors, _ = fill('{"inputs": 2.0}', x=types_pb2.DT_FLOAT)
    assert tensors["x"] == tensor("dtype: DT_FLOAT tensor_shape {} float_val: 2")


# -- Predict: errors --------------------------------------------------------------------

INT = types_pb2.DT_INT32


@pytest.mark.parametrize("body, message", [
    ('{"instances": [[1,2],[3,4],[5,6,7]]}',
     "Failed to process element: 2 of 'instances' list. Error: INVALID_ARGUMENT: "
     "Expecting tensor size: 2 but got: 3"),
    ('{"instances": [[1,2],[3,4],[[5,6]]]}',
     "Failed to process element: 2 of 'instances' list. Error: INVALID_ARGUMENT: "
     "Expecting shape [2] but got: [1,2]"),
    ('{"instances": [1, [1]]}',
     "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
     "Expecting shape [] but got: [1]"),
    ('{"instances": [[1,2],["a", "b"]]}',
     "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
     'JSON Value: "a" Type: String is not of expected type: int32'),
    ('{"instances": [1.5]}',
     "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: "
     "JSON Value: 1.5 Type: Number is not of expected type: int32"),
    ('{"instances": [2147483648]}',
     "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: "
     "JSON Value: 2147483648 Type: Number is not of expected type: int32"),
    ('{"instances": [[1, 2], [[3], 4]]}',  # the level TF Serving reports is one off
     "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
     "JSON Value: 4 found at incorrect level: 2 in the JSON DOM. Expected at level: 2"),
    ('{"instances": [[1, [2]]]}',
     "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: "
     "Encountered list at unexpected level: 1 expected < 1"),
    ('{"instances": [[[1], 2]]}',
     "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: "
     "JSON Value: 2 found at incorrect level: 2 in the JSON DOM. Expected at level: 2"),
    ('{"instances": [[[1, 2], [3]]]}',
     "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: "
     "Encountered list at unexpected size: 1 at level: 1 expected size: 2"),
    ('{"instances": [{"x": 1}]}',
     "Failed to process element: 0 key: x of 'instances' list. Error: INVALID_ARGUMENT: "
     "JSON object: does not have named input: x"),
    ('{"instances": [[1], {"x": 1}]}',
     "Expecting value/list but got object at item 1 of input list"),
    ('{"instances": [[1,2]], "inputs": [[1,2]]}',
     "JSON Value: {\n    \"instances\": [[1, 2]],\n    \"inputs\": [[1, 2]]\n} Not formatted "
     "correctly expecting only one of 'inputs' or 'instances' keys to exist "),
    ('{"instances": []}', "JSON Value: {\n    \"instances\": []\n} No values in 'instances' array"),
    ('{"instances": 1}', "JSON Value: {\n    \"instances\": 1\n} Expecting 'instances' to be an list/array"),
    ('{"signature_name": "s"}', "Missing 'inputs' or 'instances' key"),
    ('{"inputs": ["x"]}', 'JSON Value: "x" Type: String is not of expected type: int32'),
    ('{"inputs": {"b64": "aGVsbG8="}}',
     'JSON Value: {\n    "b64": "aGVsbG8="\n} Type: Object is not of expected type: int32'),
])
def test_single_input_errors(body: str, message: str) -> None:
    assert fill_error(body, default=INT) == message


def test_type_mismatch_for_float_as_in_the_handler_test() -> None:
    assert fill_error('{ "instances": ["x", "y"] }', x=types_pb2.DT_FLOAT) == (
        "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: "
        'JSON Value: "x" Type: String is not of expected type: float')


def test_multiple_input_errors() -> None:
    two = dict(int_tensor=INT, str_tensor=types_pb2.DT_STRING)
    assert fill_error('{"instances": [[1, 2]]}', **two) == (
        "instances is a plain list, but expecting list of objects as multiple input tensors "
        "required as per tensorinfo_map")
    assert fill_error('{"instances": [{"int_tensor": [1]}]}', **two) == (
        "Failed to process element: 0 of 'instances' list. JSON object: "
        '{\n    "int_tensor": [1]\n} keys must be equal to: int_tensor,str_tensor')
    assert fill_error('{"instances": [{"int_tensor": [1], "z": 1}]}', **two) == (
        "Failed to process element: 0 key: z of 'instances' list. Error: INVALID_ARGUMENT: "
        "JSON object: does not have named input: z")
    assert fill_error('{"instances": [{"int_tensor": [1], "str_tensor": ["a"]}, [1, 20]]}', **two) == (
        "Expecting object but got list at item 1 of input list")
    assert fill_error('{"instances": [{"int_tensor": [[1,2]], "str_tensor": ["a"]}, '
                      '{"int_tensor": [[[1,2]]], "str_tensor": ["b"]}]}', **two) == (
        "Failed to process element: 1 key: int_tensor of 'instances' list. Error: "
        "INVALID_ARGUMENT: Expecting shape [1,2] but got: [1,1,2]")
    assert fill_error('{"inputs": [1]}', **two) == (
        "inputs is a plain value/list, but expecting an object as multiple input tensors "
        "required as per tensorinfo_map")
    assert fill_error('{"inputs": {"int_tensor": [1]}}', **two) == (
        "Missing named input: str_tensor in 'inputs' object.")


def test_base64_errors() -> None:
    assert fill_error('{"inputs": {"b64": "%%%"}}', s=types_pb2.DT_STRING) == "Unable to base64 decode"
    assert fill_error('{"inputs": [{"b64": 1}]}', s=types_pb2.DT_STRING) == (
        'JSON Value: {\n    "b64": 1\n} not formatted correctly for base64 data')


def test_unsupported_dtype_is_unimplemented() -> None:
    with pytest.raises(Unimplemented) as caught:
        fill('{"inputs": [1.0]}', h=types_pb2.DT_HALF)
    assert caught.value.message == "Conversion of JSON Value: 1.0 to type: half"


def test_empty_input_map() -> None:
    with pytest.raises(InvalidArgument) as caught:
        jt.predict_inputs({"inputs": [1]}, {}, "")
    assert caught.value.message == "Failed to get input map for signature: DEFAULT"
    with pytest.raises(InvalidArgument) as caught:
        jt.predict_inputs({"inputs": [1]}, {}, "sig")
    assert caught.value.message == "Failed to get input map for signature: sig"


# -- Classify / Regress requests ---------------------------------------------------------

def test_examples_with_typed_features() -> None:
    request = classification_pb2.ClassificationRequest()
    fill_example_request(jt.parse_json(
        b'{"signature_name": "classify_x_to_y", "examples": [{"x": 2.0, "n": 3, "b": true, '
        b'"s": "text", "bin": {"b64": "aGVsbG8="}, "l": [1.5, 2.5], "big": 18446744073709551616}]}'),
        request)
    assert request.model_spec.signature_name == "classify_x_to_y"
    assert not request.input.HasField("example_list_with_context")
    features = request.input.example_list.examples[0].features.feature
    assert list(features["x"].float_list.value) == [2.0]
    assert list(features["n"].int64_list.value) == [3]
    assert list(features["b"].int64_list.value) == [1]
    assert list(features["s"].bytes_list.value) == [b"text"]
    assert list(features["bin"].bytes_list.value) == [b"hello"]
    assert list(features["l"].float_list.value) == [1.5, 2.5]
    assert list(features["big"].float_list.value) == [1.8446744073709552e19]


def test_examples_with_context() -> None:
    request = regression_pb2.RegressionRequest()
    fill_example_request({"context": {"c": [1, 2]}, "examples": [{"x": 1.0}, {"x": 2.0}]}, request)
    with_context = request.input.example_list_with_context
    assert list(with_context.context.features.feature["c"].int64_list.value) == [1, 2]
    assert len(with_context.examples) == 2


@pytest.mark.parametrize("body, message", [
    ('{"signature_name": 1, "examples": []}',
     "JSON Value: {\n    \"signature_name\": 1,\n    \"examples\": []\n} not formatted correctly. "
     "'signature_name' key must be a string value."),
    ('{"signature_name": "s"}',
     "JSON Value: {\n    \"signature_name\": \"s\"\n} When method is classify, key 'examples' "
     "is expected and was not found"),
    ('{"examples": {}}', "JSON Value: {\n    \"examples\": {}\n} Expecting 'examples' value to be an list/array"),
    ('{"examples": []}', "JSON Value: {\n    \"examples\": []\n} 'examples' value is an empty array"),
    ('{"examples": [[1]]}', "Example must be JSON object but got JSON Array"),
    ('{"context": 1, "examples": [{}]}', "Example must be JSON object but got JSON Number"),
    ('{"examples": [{"names": null}]}', "Feature: names has element with unexpected JSON type: Null"),
    ('{"examples": [{"names": [1, "a"]}]}', "Unexpected element type in feature: names expecting type: int64"),
    ('{"examples": [{"names": [1.5, 2]}]}', "Unexpected element type in feature: names expecting type: float"),
    ('{"examples": [{"names": ["a", 1.5]}]}', "Unexpected element type in feature: names expecting type: bytes"),
    ('{"examples": [{"names": {"a": 1}}]}', "Feature: names has element with unexpected JSON type: Object"),
    ('{"examples": [{"names": [[1]]}]}', "Feature: names has element with unexpected JSON type: Array"),
    ('{"examples": [{"names": 18446744073709551615}]}',
     "Feature: names has uint64_t element. Only int64_t is supported."),
])
@pytest.mark.parametrize("request_type", [classification_pb2.ClassificationRequest,
                                          regression_pb2.RegressionRequest])
def test_example_errors(body: str, message: str, request_type) -> None:
    with pytest.raises(InvalidArgument) as caught:
        fill_example_request(jt.parse_json(body.encode()), request_type())
    assert caught.value.message == message


def test_integer_literals_beyond_a_double_are_too_big() -> None:
    huge = "1" + "0" * 400  # rapidjson rejects it while parsing
    assert fill_error(f'{{"inputs": [{huge}]}}', x=types_pb2.DT_FLOAT) == (
        "JSON Parse error: Number too big to be stored in double. at offset: 12")
    with pytest.raises(InvalidArgument) as caught:
        fill_example_request(jt.parse_json(f'{{"examples": [{{"x": {huge}}}]}}'.encode()),
                                regression_pb2.RegressionRequest())
    assert caught.value.message == "JSON Parse error: Number too big to be stored in double. at offset: 20"
