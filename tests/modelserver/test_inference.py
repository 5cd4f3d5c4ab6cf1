"""inference.py in-process: TF Serving's checks, codes and texts, in TF Serving's order.

``FakeCore`` is a test double of ServingCore.servable (server_core.py): it resolves a
ModelSpec to servables loaded with the real load_servable and raises the NOT_FOUND
texts of core/basic_manager.cc. The network-level suite is test_conformance.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from support.requests import predict_request
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    inference_pb2,
    predict_pb2,
    regression_pb2,
)

from tfscache import errors
from tfscache.modelserver import inference
from tfscache.modelserver.servable import load_servable

tf1 = tf.compat.v1
CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"


class FakeCore:
    """Test double of ``ServingCore.servable``: {name: {version: Servable}}, labels."""

    def __init__(self, servables: dict, labels: dict | None = None) -> None:
        self.servables = servables
        self.labels = labels or {}
        self.handles_out = 0

    @contextlib.contextmanager
    def servable(self, spec):
        if not spec.name:
            raise errors.InvalidArgument("ModelSpec has no name specified.")
        versions = self.servables.get(spec.name, {})
        choice = spec.WhichOneof("version_choice")
        if choice == "version_label":
            version = self.labels[(spec.name, spec.version_label)]
            found = versions.get(version)
            request = f"Specific({spec.name}, {version})"
        elif choice == "version":
            found = versions.get(spec.version.value)
            request = f"Specific({spec.name}, {spec.version.value})"
        else:
            found = versions[max(versions)] if versions else None
            request = f"Latest({spec.name})"
        if found is None:
            raise errors.NotFound(f"Servable not found for request: {request}")
        self.handles_out += 1
        try:
            yield found
        finally:
            self.handles_out -= 1


class CountingServable:
    """Wraps a Servable and counts session runs."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.runs = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, feeds, fetches, timeout_s=None):
        self.runs += 1
        return self.inner.run(feeds, fetches, timeout_s)


def build_odd_signatures(export_dir: Path) -> Path:
    """half_plus_two's graph with signatures that break Classify/Regress in each way TF checks."""
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        serialized = tf1.placeholder(tf.string, name="tf_example", shape=[None])
        parsed = tf1.parse_example(serialized, {"x": tf1.FixedLenFeature([1], tf.float32)})
        x = tf.identity(parsed["x"], name="x")
        y = tf.identity(0.5 * x + 2.0, name="y")                        # [B,1] float
        labels = tf.identity(tf.strings.as_string(y, precision=1), name="labels")  # [B,1] string
        y_wide = tf.concat([y, y], 1, name="y_wide")                    # [B,2]
        y_tall = tf.concat([y, y], 0, name="y_tall")                    # [2B,1]
        y_flat = tf.reshape(y, [-1], name="y_flat")                     # [B]
        y_3d = tf.reshape(y, [-1, 1, 1], name="y_3d")                   # [B,1,1]
        y_int = tf.cast(y, tf.int32, name="y_int")
        build = tf1.saved_model.utils.build_tensor_info
        inp = {"inputs": build(serialized)}

        def sig(inputs, outputs, method=CLASSIFY):
            return tf1.saved_model.signature_def_utils.build_signature_def(
                inputs, {k: build(v) for k, v in outputs.items()}, method)

        signatures = {
            "serving_default": sig(inp, {"classes": labels, "scores": y}),
            "two_inputs": sig({**inp, "x": build(x)}, {"scores": y}),
            "three_outputs": sig(inp, {"classes": labels, "scores": y, "extra": y}),
            "two_outputs": sig(inp, {"outputs": y, "extra": y}, REGRESS),
            "classes_float": sig(inp, {"classes": y}),
            "scores_1d": sig(inp, {"scores": y_flat}),
            "scores_tall": sig(inp, {"scores": y_tall}),
            "class_score_mismatch": sig(inp, {"classes": labels, "scores": y_wide}),
            "outputs_3d": sig(inp, {"outputs": y_3d}, REGRESS),
            "outputs_wide": sig(inp, {"outputs": y_wide}, REGRESS),
            "outputs_int": sig(inp, {"outputs": y_int}, REGRESS),
            "outputs_tall": sig(inp, {"outputs": y_tall}, REGRESS),
            "outputs_1d": sig(inp, {"outputs": y_flat}, REGRESS),
        }
        builder = tf1.saved_model.Builder(str(export_dir))
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map=signatures)
        builder.save()
    return export_dir


@pytest.fixture(scope="module")
def core(test_models, synthetic_models, tmp_path_factory):
    hp2 = test_models / "half_plus_two"
    odd = build_odd_signatures(tmp_path_factory.mktemp("odd") / "1")
    (addk,) = synthetic_models([3])
    servables = {
        "half_plus_two": {
            123: load_servable("half_plus_two", 123, str(hp2 / "00000123")),
            124: load_servable("half_plus_two", 124, str(hp2 / "00000124")),
        },
        "half_plus_three": {123: load_servable(
            "half_plus_three", 123, str(test_models / "half_plus_three" / "00000123"))},
        "tf2": {123: load_servable(
            "tf2", 123, str(test_models / "half_plus_two_tf2" / "00000123"))},
        "odd": {1: load_servable("odd", 1, str(odd))},
        "addk_3": {1: load_servable("addk_3", 1, str(addk / "1"))},
    }
    yield FakeCore(servables, labels={("half_plus_two", "stable"): 123,
                                      ("half_plus_two", "canary"): 124,
                                      ("half_plus_two", "gone"): 999})
    for versions in servables.values():
        for s in versions.values():
            s.unload()


def raises(exc_type, message, fn, *args):
    with pytest.raises(exc_type) as info:
        fn(*args)
    assert type(info.value) is exc_type, repr(info.value)
    assert info.value.message == message
    return info.value


def float_tensor(values, shape=None):
    return tf.make_tensor_proto(values, dtype=tf.float32, shape=shape)


def example(**features) -> tf.train.Example:
    return tf.train.Example(features=tf.train.Features(feature={
        k: tf.train.Feature(float_list=tf.train.FloatList(value=[v])) for k, v in features.items()}))


def spec_tuple(model_spec):
    choice = model_spec.WhichOneof("version_choice")
    return (model_spec.name, model_spec.signature_name,
            model_spec.version.value if choice == "version" else choice)


# -- Predict -----------------------------------------------------------------------------


def test_predict_half_plus_two(core):
    response = inference.predict(core, predict_request(), 10.0)
    y = response.outputs["y"]
    assert (y.dtype, [d.size for d in y.tensor_shape.dim], list(y.float_val)) == (
        types_pb2.DT_FLOAT, [1], [3.0])
    assert not y.tensor_content  # AsProtoField, not tensor_content
    assert spec_tuple(response.model_spec) == ("half_plus_two", "serving_default", 124)
    assert core.handles_out == 0


@pytest.mark.parametrize("output_filter", [(), ("y",)])
def test_predict_with_and_without_output_filter(core, output_filter):
    response = inference.predict(core, predict_request(output_filter=output_filter, version=123))
    assert list(response.outputs) == ["y"]
    assert list(response.outputs["y"].float_val) == [3.0]
    assert spec_tuple(response.model_spec) == ("half_plus_two", "serving_default", 123)


def test_predict_explicit_signature_is_echoed(core):
    response = inference.predict(core, predict_request(signature="serving_default"))
    assert response.model_spec.signature_name == "serving_default"


def test_predict_label_is_resolved_and_never_echoed(core):
    response = inference.predict(core, predict_request(label="stable"))
    assert spec_tuple(response.model_spec) == ("half_plus_two", "serving_default", 123)
    assert not response.model_spec.version_label


@pytest.mark.parametrize("shape, values, out_shape", [
    (None, 2.0, []),                 # scalar in, scalar out (predict_impl_test)
    ([1, 1], [2.0], [1, 1]),         # batch_input
    ([3], [2.0, 3.0, 4.0], [3]),
    ([2, 2], [1.0, 2.0, 3.0, 4.0], [2, 2]),
])
def test_predict_accepts_any_shape_the_graph_accepts(core, shape, values, out_shape):
    response = inference.predict(core, predict_request(inputs={"x": float_tensor(values, shape)}))
    y = response.outputs["y"]
    assert [d.size for d in y.tensor_shape.dim] == out_shape
    expected = [0.5 * v + 2.0 for v in np.ravel(values)]
    assert list(y.float_val) == expected


def test_predict_runs_regress_and_classify_signatures(core):
    response = inference.predict(core, predict_request(
        signature="regress_x2_to_y3", inputs={"inputs": float_tensor([2.0], [1])}))
    assert list(response.outputs["outputs"].float_val) == [4.0]
    serialized = tf.make_tensor_proto([example(x=2.0).SerializeToString()], shape=[1])
    response = inference.predict(core, predict_request(
        signature="classify_x_to_y", inputs={"inputs": serialized}))
    assert list(response.outputs["scores"].float_val) == [3.0]
    assert [d.size for d in response.outputs["scores"].tensor_shape.dim] == [1, 1]


def test_predict_tf2_model_uses_signature_default(core):
    response = inference.predict(core, predict_request(name="tf2", inputs={}))
    assert list(response.outputs["y"].float_val) == [2.0]  # default x=[0.0]
    response = inference.predict(core, predict_request(name="tf2"))
    assert list(response.outputs["y"].float_val) == [3.0]
    assert spec_tuple(response.model_spec) == ("tf2", "serving_default", 123)


def test_predict_zero_input_signature_and_int64_output(core):
    response = inference.predict(core, predict_request(name="addk_3", signature="version", inputs={}))
    v = response.outputs["version"]
    assert (v.dtype, list(v.int64_val), list(v.tensor_shape.dim)) == (types_pb2.DT_INT64, [1], [])
    response = inference.predict(core, predict_request(name="addk_3", inputs={"x": float_tensor(1.0)}))
    assert list(response.outputs["y"].float_val) == [4.0]


def test_predict_missing_model_spec(core):
    raises(errors.InvalidArgument, "Missing ModelSpec", inference.predict, core,
           predict_pb2.PredictRequest())


def test_predict_handle_errors_come_from_the_core(core):
    raises(errors.NotFound, "Servable not found for request: Latest(nope)",
           inference.predict, core, predict_request(name="nope", signature="bad"))
    raises(errors.NotFound, "Servable not found for request: Specific(half_plus_two, 7)",
           inference.predict, core, predict_request(version=7))
    raises(errors.NotFound, "Servable not found for request: Specific(half_plus_two, 999)",
           inference.predict, core, predict_request(label="gone"))
    raises(errors.InvalidArgument, "ModelSpec has no name specified.",
           inference.predict, core, predict_request(name=""))


def test_predict_missing_signature_is_failed_precondition(core):
    raises(errors.FailedPrecondition, 'Serving signature key "nope" not found.',
           inference.predict, core, predict_request(signature="nope", inputs={}))


def test_predict_too_many_inputs(core):
    raises(errors.InvalidArgument,
           "input size does not match signature: 2!=1 len({x,z}) != len({x}). "
           "Sent extra: {z}. Missing but required: {}.",
           inference.predict, core,
           predict_request(inputs={"z": float_tensor([1.0]), "x": float_tensor([1.0])}))


def test_predict_no_inputs(core):
    raises(errors.InvalidArgument,
           "input size does not match signature: 0!=1 len({}) != len({x}). "
           "Sent extra: {}. Missing but required: {x}.",
           inference.predict, core, predict_request(inputs={}))


def test_predict_wrong_input_name(core):
    raises(errors.InvalidArgument,
           "Signature input alias: x(feed name: x:0) not found in request and no default "
           "value provided. Inputs expected to be in the request {z}, or default input "
           "alias set: ",
           inference.predict, core, predict_request(inputs={"z": float_tensor([1.0])}))


def test_predict_unknown_name_with_defaults_present(core):
    raises(errors.InvalidArgument,
           "Inputs contains invalid name. Used request inputs: , request input: z",
           inference.predict, core, predict_request(name="tf2", inputs={"z": float_tensor([1.0])}))
    raises(errors.InvalidArgument,
           "input size does not match signature: 2!=1 len({x,z}) != len({x}). "
           "Sent extra: {z}. Missing but required: {}.",
           inference.predict, core,
           predict_request(name="tf2", inputs={"x": float_tensor([1.0]), "z": float_tensor([1.0])}))


def test_predict_unparsable_tensor(core):
    bad = tf.make_tensor_proto(np.array([1.0, 2.0], np.float32))
    bad.tensor_content = bad.tensor_content[:5]
    raises(errors.InvalidArgument, "tensor parsing error: x",
           inference.predict, core, predict_request(inputs={"x": bad}))


def test_predict_wrong_dtype(core):
    raises(errors.InvalidArgument, "Expects arg[0] to be float but string is provided",
           inference.predict, core,
           predict_request(inputs={"x": tf.make_tensor_proto([b"2.0"])}))


def test_predict_unknown_output_alias(core):
    raises(errors.InvalidArgument,
           "output tensor alias not found in signature: w Outputs expected to be in the set {y}.",
           inference.predict, core, predict_request(output_filter=["w"]))


def test_predict_duplicate_output_alias(core):
    raises(errors.InvalidArgument, "duplicate output tensor alias: y",
           inference.predict, core, predict_request(output_filter=["y", "y"]))


def test_predict_input_errors_win_over_output_filter_errors(core):
    raises(errors.InvalidArgument,
           "input size does not match signature: 0!=1 len({}) != len({x}). "
           "Sent extra: {}. Missing but required: {x}.",
           inference.predict, core, predict_request(inputs={}, output_filter=["w"]))


def test_predict_session_timeout_is_deadline_exceeded(tmp_path):
    from support.models.tfserving import build_gate

    gate = load_servable("gate", 1, str(build_gate(tmp_path) / "1"))
    try:
        fake = FakeCore({"gate": {1: gate}})
        with pytest.raises(errors.DeadlineExceeded):
            inference.predict(fake, predict_request(name="gate", inputs={}), 0.05)
        assert fake.handles_out == 0
    finally:
        gate.unload()


# -- Classify / Regress ------------------------------------------------------------------


def classify_request(name="half_plus_two", signature="classify_x_to_y", examples=None,
                     context=None, version=None):
    request = classification_pb2.ClassificationRequest()
    fill_request(request, name, signature, examples, context, version)
    return request


def regress_request(name="half_plus_two", signature="regress_x_to_y", examples=None,
                    context=None, version=None):
    request = regression_pb2.RegressionRequest()
    fill_request(request, name, signature, examples, context, version)
    return request


def fill_request(request, name, signature, examples, context, version):
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    examples = [example(x=2.0)] if examples is None else examples
    if context is not None:
        request.input.example_list_with_context.context.CopyFrom(context)
        request.input.example_list_with_context.examples.extend(examples)
    elif examples:
        request.input.example_list.examples.extend(examples)


def scores(response):
    return [[(c.label, c.score) for c in cl.classes] for cl in response.result.classifications]


@pytest.mark.parametrize("name", ["half_plus_two", "tf2"])
def test_classify(core, name):
    response = inference.classify(core, classify_request(name=name, version=123))
    assert scores(response) == [[("", 3.0)]]
    assert spec_tuple(response.model_spec) == (name, "classify_x_to_y", 123)


@pytest.mark.parametrize("name", ["half_plus_two", "tf2"])
def test_regress(core, name):
    response = inference.regress(core, regress_request(name=name))
    assert [r.value for r in response.result.regressions] == [3.0]
    assert spec_tuple(response.model_spec) == (name, "regress_x_to_y", max(core.servables[name]))


def test_regress_other_signatures(core):
    response = inference.regress(core, regress_request(signature="regress_x_to_y2"))
    assert [r.value for r in response.result.regressions] == [4.0]
    response = inference.regress(core, regress_request(name="half_plus_three", signature=REGRESS))
    assert [r.value for r in response.result.regressions] == [4.0]
    response = inference.regress(core, regress_request(name="odd", signature="outputs_1d"))
    assert [r.value for r in response.result.regressions] == [3.0]


def test_classify_several_examples(core):
    response = inference.classify(core, classify_request(examples=[example(x=2.0), example(x=4.0)]))
    assert scores(response) == [[("", 3.0)], [("", 4.0)]]


def test_classify_with_context_concatenates_context_and_example(core):
    # Each element is context bytes + example bytes, so the context supplies x.
    response = inference.classify(core, classify_request(
        examples=[example(x2=1.0), example(x2=5.0)], context=example(x=6.0)))
    assert scores(response) == [[("", 5.0)], [("", 5.0)]]
    # An example's own feature comes later in the bytes and wins (proto merge).
    response = inference.regress(core, regress_request(
        examples=[example(x=2.0)], context=example(x=6.0)))
    assert [r.value for r in response.result.regressions] == [3.0]


def test_classify_labels_and_default_signature(core):
    response = inference.classify(core, classify_request(name="odd", signature="",
                                                         examples=[example(x=2.0)]))
    assert scores(response) == [[("3.0", 3.0)]]
    assert spec_tuple(response.model_spec) == ("odd", "serving_default", 1)


@pytest.mark.parametrize("fn, request_fn", [
    (inference.classify, classification_pb2.ClassificationRequest),
    (inference.regress, regression_pb2.RegressionRequest),
])
def test_classify_regress_missing_model_spec(core, fn, request_fn):
    raises(errors.InvalidArgument, "Missing ModelSpec", fn, core, request_fn())


@pytest.mark.parametrize("fn, request_fn", [
    (inference.classify, classify_request), (inference.regress, regress_request)])
def test_classify_regress_missing_signature_is_invalid_argument(core, fn, request_fn):
    raises(errors.InvalidArgument, "No signature was found with the name: nope",
           fn, core, request_fn(signature="nope"))
    raises(errors.NotFound, "Servable not found for request: Latest(nope)",
           fn, core, request_fn(name="nope", signature="nope"))


@pytest.mark.parametrize("fn, request_fn", [
    (inference.classify, classify_request), (inference.regress, regress_request)])
def test_classify_regress_empty_input(core, fn, request_fn):
    raises(errors.InvalidArgument, "Input is empty.", fn, core, request_fn(examples=[]))
    raises(errors.InvalidArgument, "Input is empty.", fn, core,
           request_fn(examples=[], context=example(x=1.0)))


HALF_PLUS_TWO_SERVING_DEFAULT_DEBUG_STRING = """\
inputs {
  key: "x"
  value {
    name: "x:0"
    dtype: DT_FLOAT
    tensor_shape {
      dim {
        size: -1
      }
      dim {
        size: 1
      }
    }
  }
}
outputs {
  key: "y"
  value {
    name: "y:0"
    dtype: DT_FLOAT
    tensor_shape {
      dim {
        size: -1
      }
      dim {
        size: 1
      }
    }
  }
}
method_name: "tensorflow/serving/predict"
"""


def test_classify_needs_inputs_key(core):
    raises(errors.InvalidArgument,
           "No classification inputs found in SignatureDef: " + HALF_PLUS_TWO_SERVING_DEFAULT_DEBUG_STRING,
           inference.classify, core, classify_request(signature="serving_default"))


def test_regress_needs_inputs_key(core):
    raises(errors.InvalidArgument,
           "No regression inputs found in SignatureDef: " + HALF_PLUS_TWO_SERVING_DEFAULT_DEBUG_STRING,
           inference.regress, core, regress_request(signature="serving_default"))


def test_classify_needs_classes_or_scores(core):
    signature = core.servables["half_plus_two"][124].signature_defs["regress_x_to_y"]
    raises(errors.InvalidArgument,
           'Expected classification signature outputs to contain at least one of "classes" or '
           '"scores". Signature was: ' + text_format.MessageToString(signature),
           inference.classify, core, classify_request(signature="regress_x_to_y"))


def test_regress_needs_outputs_key(core):
    signature = core.servables["half_plus_two"][124].signature_defs["classify_x_to_y"]
    raises(errors.InvalidArgument,
           "No regression outputs found in SignatureDef: " + text_format.MessageToString(signature),
           inference.regress, core, regress_request(signature="classify_x_to_y"))


@pytest.mark.parametrize("fn, request_fn, signature, message", [
    (inference.classify, classify_request, "two_inputs", "Expected one input Tensor."),
    (inference.regress, regress_request, "two_inputs", "Expected one input Tensor."),
    (inference.classify, classify_request, "three_outputs",
     "Expected one or two output Tensors, found 3"),
    (inference.regress, regress_request, "two_outputs", "Expected one output Tensor."),
    (inference.classify, classify_request, "classes_float",
     "Expected classes Tensor of DT_STRING. Got: DT_FLOAT"),
    (inference.classify, classify_request, "scores_1d",
     "Expected Tensor shape: [batch_size num_classes] but got [1]"),
    (inference.classify, classify_request, "scores_tall",
     "Expected scores output batch size of 1. Got: 2"),
    (inference.classify, classify_request, "class_score_mismatch",
     "Tensors class and score should match in dim_size(1). Got 1 vs. 2"),
    (inference.regress, regress_request, "outputs_3d",
     "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got [1,1,1]"),
    (inference.regress, regress_request, "outputs_wide",
     "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got [1,2]"),
    (inference.regress, regress_request, "outputs_int",
     "Expected output Tensor of DT_FLOAT.  Got: DT_INT32"),
    (inference.regress, regress_request, "outputs_tall",
     "Input batch size did not match output batch size: 1 vs. 2"),
])
def test_signature_structure_and_output_checks(core, fn, request_fn, signature, message):
    raises(errors.InvalidArgument, message, fn, core, request_fn(name="odd", signature=signature))


def test_classify_on_float_input_signature_is_a_dtype_error(core):
    raises(errors.InvalidArgument, "Expects arg[0] to be float but string is provided",
           inference.classify, core, classify_request(signature="classify_x2_to_y3"))


def test_structure_checks_run_before_input_checks(core):
    raises(errors.InvalidArgument, "Expected one input Tensor.",
           inference.classify, core, classify_request(name="odd", signature="two_inputs", examples=[]))


# -- MultiInference ----------------------------------------------------------------------


def multi_request(tasks, examples=None, name="half_plus_two"):
    request = inference_pb2.MultiInferenceRequest()
    for task in tasks:
        t = request.tasks.add()
        if isinstance(task, tuple):
            signature, method = task[:2]
            t.model_spec.name = task[2] if len(task) > 2 else name
            t.model_spec.signature_name = signature
            t.method_name = method
    request.input.example_list.examples.extend([example(x=2.0)] if examples is None else examples)
    return request


def test_multi_inference_one_session_run(core):
    counting = CountingServable(core.servables["half_plus_two"][123])
    fake = FakeCore({"half_plus_two": {123: counting}})
    response = inference.multi_inference(fake, multi_request([
        ("regress_x_to_y", REGRESS), ("classify_x_to_y", CLASSIFY), ("regress_x_to_y2", REGRESS)]))
    assert counting.runs == 1
    assert len(response.results) == 3
    regress, classify, regress2 = response.results
    assert [r.value for r in regress.regression_result.regressions] == [3.0]
    assert [[c.score for c in cl.classes]
            for cl in classify.classification_result.classifications] == [[3.0]]
    assert [r.value for r in regress2.regression_result.regressions] == [4.0]
    assert [spec_tuple(r.model_spec) for r in response.results] == [
        ("half_plus_two", "regress_x_to_y", 123), ("half_plus_two", "classify_x_to_y", 123),
        ("half_plus_two", "regress_x_to_y2", 123)]


def test_multi_inference_tf2_and_version_from_first_task(core):
    response = inference.multi_inference(core, multi_request(
        [("regress_x_to_y", REGRESS), ("classify_x_to_y", CLASSIFY)], name="tf2"))
    assert [spec_tuple(r.model_spec) for r in response.results] == [
        ("tf2", "regress_x_to_y", 123), ("tf2", "classify_x_to_y", 123)]
    request = multi_request([("regress_x_to_y", REGRESS)])
    request.tasks[0].model_spec.version.value = 123
    response = inference.multi_inference(core, request)
    assert response.results[0].model_spec.version.value == 123


def test_multi_inference_default_signature_is_filled_in(core):
    response = inference.multi_inference(core, multi_request([("", CLASSIFY)], name="odd"))
    assert spec_tuple(response.results[0].model_spec) == ("odd", "serving_default", 1)


def test_multi_inference_no_tasks_has_no_missing_model_spec_check(core):
    raises(errors.InvalidArgument, "ModelSpec has no name specified.",
           inference.multi_inference, core, inference_pb2.MultiInferenceRequest())


@pytest.mark.parametrize("tasks, exc_type, message", [
    ([("regress_x_to_y", REGRESS), ("classify_x_to_y", CLASSIFY, "")], errors.InvalidArgument,
     "Found ModelSpec with an empty model name."),
    ([("regress_x_to_y", REGRESS), ("classify_x_to_y", CLASSIFY, "other")], errors.InvalidArgument,
     "All ModelSpecs in a MultiInferenceRequest must access the same model name."),
    ([("regress_x_to_y", REGRESS), ("regress_x_to_y", REGRESS)], errors.InvalidArgument,
     "Duplicate evaluation of signature: regress_x_to_y"),
    ([("regress_x_to_y", REGRESS), ("nope", REGRESS)], errors.InvalidArgument,
     "Requested signature not found in model graph: nope"),
    ([("serving_default", "tensorflow/serving/predict")], errors.Unimplemented,
     "Unsupported signature method_name: tensorflow/serving/predict"),
])
def test_multi_inference_task_checks(core, tasks, exc_type, message):
    raises(exc_type, message, inference.multi_inference, core, multi_request(tasks))


def test_multi_inference_checks_signature_structure_per_method(core):
    signature = core.servables["half_plus_two"][124].signature_defs["regress_x_to_y"]
    raises(errors.InvalidArgument,
           'Expected classification signature outputs to contain at least one of "classes" or '
           '"scores". Signature was: ' + text_format.MessageToString(signature),
           inference.multi_inference, core, multi_request([("regress_x_to_y", CLASSIFY)]))


def test_multi_inference_empty_input_is_checked_after_the_tasks(core):
    raises(errors.InvalidArgument, "Input is empty.", inference.multi_inference, core,
           multi_request([("regress_x_to_y", REGRESS)], examples=[]))
    raises(errors.InvalidArgument, "Duplicate evaluation of signature: regress_x_to_y",
           inference.multi_inference, core,
           multi_request([("regress_x_to_y", REGRESS)] * 2, examples=[]))


# -- GetModelMetadata --------------------------------------------------------------------


def metadata_request(name="half_plus_two", fields=("signature_def",), version=None):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = "ignored"
    if version is not None:
        request.model_spec.version.value = version
    request.metadata_field.extend(fields)
    return request


def test_get_model_metadata(core):
    response = inference.get_model_metadata(core, metadata_request(version=123))
    assert spec_tuple(response.model_spec) == ("half_plus_two", "", 123)
    assert list(response.metadata) == ["signature_def"]
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    assert dict(signature_map.signature_def) == core.servables["half_plus_two"][123].signature_defs
    assert len(signature_map.signature_def) == 6


def test_get_model_metadata_missing_model_spec(core):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.metadata_field.append("bogus")
    raises(errors.InvalidArgument, "Missing ModelSpec", inference.get_model_metadata, core, request)


def test_get_model_metadata_field_checks_come_before_the_handle(core):
    raises(errors.InvalidArgument,
           "GetModelMetadataRequest must specify at least one metadata_field",
           inference.get_model_metadata, core, metadata_request(name="nope", fields=()))
    raises(errors.InvalidArgument, "Metadata field bogus is not supported",
           inference.get_model_metadata, core,
           metadata_request(name="nope", fields=("signature_def", "bogus")))
    raises(errors.NotFound, "Servable not found for request: Latest(nope)",
           inference.get_model_metadata, core, metadata_request(name="nope"))

