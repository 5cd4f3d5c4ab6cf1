"""servable.py in-process: loading, TF1 session semantics, errors, timeouts, threads."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from tfscache import errors
from tfscache.modelserver import servable as servable_mod
from tfscache.modelserver.servable import from_proto, load_servable, to_proto_field
from support.models.tfserving import build_gate


@pytest.fixture(scope="module")
def half_plus_two(test_models):
    s = load_servable("half_plus_two", 123, str(test_models / "half_plus_two" / "00000123"))
    yield s
    s.unload()


@pytest.fixture(scope="module")
def tf2_model(test_models):
    s = load_servable("half_plus_two_tf2", 123, str(test_models / "half_plus_two_tf2" / "00000123"))
    yield s
    s.unload()


@pytest.fixture(scope="module")
def queue_model(tmp_path_factory):
    base = build_gate(tmp_path_factory.mktemp("gate"))
    s = load_servable("gate", 1, str(base / "1"))
    yield s
    s.unload()


# -- loading ------------------------------------------------------------------------------


def test_load_exposes_name_version_path_and_signatures(half_plus_two, test_models):
    assert half_plus_two.name == "half_plus_two"
    assert half_plus_two.version == 123
    assert half_plus_two.path == str(test_models / "half_plus_two" / "00000123")
    assert sorted(half_plus_two.signature_defs) == [
        "classify_x2_to_y3", "classify_x_to_y", "regress_x2_to_y3", "regress_x_to_y",
        "regress_x_to_y2", "serving_default"]
    assert half_plus_two.signature_defs["serving_default"].inputs["x"].name == "x:0"
    assert list(half_plus_two.meta_graph_def.meta_info_def.tags) == ["serve"]


def test_missing_directory_is_not_found_with_tf_serving_text(tmp_path):
    path = str(tmp_path / "nothing" / "1")
    with pytest.raises(errors.NotFound) as info:
        load_servable("m", 1, path)
    assert info.value.message == (
        "Could not find SavedModel .pb or .pbtxt at supplied export directory path: " + path)


def test_empty_directory_is_not_found(tmp_path):
    with pytest.raises(errors.NotFound) as info:
        load_servable("m", 1, str(tmp_path))
    assert info.value.message.startswith("Could not find SavedModel .pb or .pbtxt")


def test_garbage_saved_model_is_data_loss(tmp_path):
    from support.models.tfserving import build_corrupt

    base = build_corrupt(tmp_path, "broken", version=2)
    with pytest.raises(errors.DataLoss) as info:
        load_servable("broken", 2, str(base / "2"))
    assert info.value.message == f"Can't parse {base / '2' / 'saved_model.pb'} as binary proto"
    assert info.value.grpc_code.name == "DATA_LOSS"


def test_unknown_tags_are_not_found(test_models):
    with pytest.raises(errors.NotFound) as info:
        load_servable("m", 123, str(test_models / "half_plus_two" / "00000123"), tags=("gpu",))
    assert info.value.message == (
        "Could not find meta graph def matching supplied tags: { gpu }. To inspect available "
        "tag-sets in the SavedModel, please use the SavedModel CLI: `saved_model_cli`")


def test_missing_variables_fail_the_load(test_models, tmp_path):
    copy = tmp_path / "1"
    shutil.copytree(test_models / "half_plus_two" / "00000123", copy)
    shutil.rmtree(copy / "variables")
    with pytest.raises(errors.TfscacheError) as info:
        load_servable("m", 1, str(copy))
    assert str(copy) in info.value.message


def test_text_format_saved_model_loads(test_models, tmp_path):
    copy = tmp_path / "1"
    shutil.copytree(test_models / "half_plus_two" / "00000123", copy)
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((copy / "saved_model.pb").read_bytes())
    (copy / "saved_model.pb").unlink()
    (copy / "saved_model.pbtxt").write_text(text_format.MessageToString(saved_model))
    s = load_servable("m", 1, str(copy))
    try:
        assert s.run({"x:0": np.array([4.0], np.float32)}, ["y:0"])[0].tolist() == [4.0]
    finally:
        s.unload()


# -- running: any feed shape the graph accepts, like the C++ session ---------------------


@pytest.mark.parametrize("shape", [(), (1,), (3,), (1, 1), (2, 1)])
def test_half_plus_two_accepts_any_feed_shape(half_plus_two, shape):
    # Python's Session.run would refuse (1,) or () into the [-1,1] tensor x:0.
    (y,) = half_plus_two.run({"x:0": np.full(shape, 2.0, np.float32)}, ["y:0"])
    assert np.shape(y) == shape
    assert np.all(np.asarray(y) == 3.0)


def test_tf2_model_accepts_batch_into_static_shape_one(tf2_model):
    sig = tf2_model.signature_defs["serving_default"]
    assert [d.size for d in sig.inputs["x"].tensor_shape.dim] == [1]
    (y,) = tf2_model.run({sig.inputs["x"].name: np.array([[2.0], [4.0]], np.float32)},
                         [sig.outputs["y"].name])
    assert y.tolist() == [[3.0], [4.0]]


def test_tf2_example_signature_runs_on_serialized_examples(tf2_model):
    sig = tf2_model.signature_defs["regress_x_to_y2"]
    example = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[4.0]))}))
    feed = np.array([example.SerializeToString()], dtype=object)
    (y,) = tf2_model.run({sig.inputs["inputs"].name: feed}, [sig.outputs["outputs"].name])
    assert y.tolist() == [[5.0]]


def test_feeds_may_be_tensor_protos(half_plus_two):
    proto = tf.make_tensor_proto([1.0, 2.0], dtype=tf.float32, shape=[2, 1])
    (y,) = half_plus_two.run({"x:0": proto}, ["y:0"])
    assert y.tolist() == [[2.5], [3.0]]


def test_several_fetches_come_back_in_order(half_plus_two):
    y, y2 = half_plus_two.run({"x:0": np.array([2.0], np.float32)}, ["y:0", "y2:0"])
    assert (y.tolist(), y2.tolist()) == ([3.0], [4.0])


@pytest.mark.parametrize("value, given", [
    (np.array([b"a"], dtype=object), "string"),
    (np.array([2.0], np.float64), "double"),
    (np.array([2], np.int32), "int32"),
])
def test_wrong_dtype_is_invalid_argument_with_tf_text(half_plus_two, value, given):
    with pytest.raises(errors.InvalidArgument) as info:
        half_plus_two.run({"x:0": value}, ["y:0"])
    assert info.value.message == f"Expects arg[0] to be float but {given} is provided"


def test_wrong_dtype_names_the_argument_position(half_plus_two):
    with pytest.raises(errors.InvalidArgument) as info:
        half_plus_two.run({"x:0": np.array([1.0], np.float32),
                           "tf_example:0": np.array([1.0], np.float32)}, ["y:0"])
    assert info.value.message == "Expects arg[1] to be string but float is provided"


def test_unknown_tensor_is_not_found(half_plus_two):
    with pytest.raises(errors.NotFound) as info:
        half_plus_two.run({"nope:0": np.array([1.0], np.float32)}, ["y:0"])
    assert "nope:0" in info.value.message


def test_tf_runtime_errors_keep_their_code(half_plus_two):
    # y:0 depends on x:0, which depends on the tf_example placeholder: not fed.
    with pytest.raises(errors.InvalidArgument) as info:
        half_plus_two.run({}, ["y:0"])
    assert "tf_example" in info.value.message


def test_timeout_becomes_deadline_exceeded(queue_model):
    with pytest.raises(errors.DeadlineExceeded) as info:
        queue_model.run({}, ["dequeued:0"], timeout_s=0.05)
    assert "Timed out" in info.value.message or "deadline" in info.value.message.lower()
    assert info.value.grpc_code.name == "DEADLINE_EXCEEDED"


def test_runs_are_concurrent_on_one_servable(queue_model):
    """A run blocked inside the session does not block another run of the same servable."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        blocked = pool.submit(queue_model.run, {}, ["dequeued:0"], 30.0)
        # The enqueue runs while the dequeue is in the session, and releases it.
        (enqueued,) = queue_model.run({"value:0": np.float32(7.0)}, ["released:0"], 30.0)
        assert float(enqueued) == 7.0
        assert float(blocked.result(timeout=30)[0]) == 7.0


def test_many_threads_get_their_own_answers(half_plus_two):
    barrier = threading.Barrier(8)

    def worker(i: int) -> list[float]:
        barrier.wait(timeout=30)
        return [float(half_plus_two.run({"x:0": np.array([i * 100.0 + j], np.float32)},
                                        ["y:0"])[0][0]) for j in range(50)]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(worker, range(8)))
    for i, values in enumerate(results):
        assert values == [0.5 * (i * 100.0 + j) + 2.0 for j in range(50)]


def test_unload_closes_the_session(test_models):
    s = load_servable("half_plus_two", 124, str(test_models / "half_plus_two" / "00000124"))
    assert s.run({"x:0": np.array([2.0], np.float32)}, ["y:0"])[0].tolist() == [3.0]
    s.unload()
    with pytest.raises(errors.Unavailable):
        s.run({"x:0": np.array([2.0], np.float32)}, ["y:0"])
    s.unload()  # idempotent


# -- TensorProto conversion (Tensor::FromProto / AsProtoField) ---------------------------


def test_from_proto_repeats_the_last_value_and_truncates():
    proto = tf.make_tensor_proto([1.0], dtype=tf.float32, shape=[3])
    assert from_proto(proto).tolist() == [1.0, 1.0, 1.0]
    proto = text_format.Parse(
        "dtype: DT_FLOAT tensor_shape { dim { size: 3 } } float_val: 1 float_val: 2",
        tensor_pb2.TensorProto())
    assert from_proto(proto).tolist() == [1.0, 2.0, 2.0]
    proto.ClearField("float_val")
    proto.float_val.extend([5, 6, 7, 8])
    assert from_proto(proto).tolist() == [5.0, 6.0, 7.0]
    proto.ClearField("float_val")
    assert from_proto(proto).tolist() == [0.0, 0.0, 0.0]


def test_from_proto_refuses_what_tf_refuses():
    bad_content = tf.make_tensor_proto(np.array([1.0, 2.0], np.float32))
    bad_content.tensor_content = bad_content.tensor_content[:-1]
    assert from_proto(bad_content) is None
    negative = tf.make_tensor_proto(np.array([1.0], np.float32))
    negative.tensor_shape.dim[0].size = -1
    assert from_proto(negative) is None
    invalid = tf.make_tensor_proto(np.array([1.0], np.float32))
    invalid.dtype = types_pb2.DT_INVALID
    assert from_proto(invalid) is None


@pytest.mark.parametrize("array, field", [
    (np.array([[1.5], [2.5]], np.float32), "float_val"),
    (np.array([1.5], np.float64), "double_val"),
    (np.array([1, -2], np.int32), "int_val"),
    (np.array([7], np.uint8), "int_val"),
    (np.array([1 << 40], np.int64), "int64_val"),
    (np.array([True, False]), "bool_val"),
    (np.array([b"a", b"bc"], dtype=object), "string_val"),
    (np.array([1.5], np.float16), "half_val"),
    (np.array([1 + 2j], np.complex64), "scomplex_val"),
])
def test_to_proto_field_uses_typed_fields_and_round_trips(array, field):
    proto = to_proto_field(array, tensor_pb2.TensorProto())
    assert not proto.tensor_content
    assert len(getattr(proto, field)) > 0
    assert [d.size for d in proto.tensor_shape.dim] == list(array.shape)
    back = from_proto(proto)
    assert back.dtype == array.dtype and back.tolist() == array.tolist()
    assert np.array_equal(tf.make_ndarray(proto), array)


def test_scalar_output_has_an_empty_shape():
    proto = to_proto_field(np.float32(3.0), tensor_pb2.TensorProto())
    assert proto.HasField("tensor_shape") and not proto.tensor_shape.dim
    assert list(proto.float_val) == [3.0]


def test_dtype_names_are_tf_data_type_strings():
    assert servable_mod.dtype_name(types_pb2.DT_FLOAT) == "float"
    assert servable_mod.dtype_name(types_pb2.DT_STRING) == "string"
    assert servable_mod.dtype_name(types_pb2.DT_INT64) == "int64"
    assert servable_mod.dtype_name(types_pb2.DT_HALF) == "half"
