"""The generated test models have the names, tensors and signatures of TF Serving's
own test models (docs/upstream/tfserving.md,
"Test SavedModels"), and the synthetic ones what the cache
tests rely on."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from support.models import tfserving as testmodels

FLOAT, STRING, INT64 = types_pb2.DT_FLOAT, types_pb2.DT_STRING, types_pb2.DT_INT64
PREDICT = "tensorflow/serving/predict"
CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    return testmodels.build_test_models(tmp_path_factory.mktemp("models"))


def meta_graph(version_dir: Path):
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((version_dir / "saved_model.pb").read_bytes())
    assert len(saved_model.meta_graphs) == 1
    return saved_model.meta_graphs[0]


def shape(info):
    if info.tensor_shape.unknown_rank:
        return None
    return [d.size for d in info.tensor_shape.dim]


def describe(signature):
    """{alias: (tensor name, dtype, shape)} for inputs and outputs, and the method."""
    return ({k: (v.name, v.dtype, shape(v)) for k, v in signature.inputs.items()},
            {k: (v.name, v.dtype, shape(v)) for k, v in signature.outputs.items()},
            signature.method_name)


def test_names_and_version_directories(built):
    assert set(built) == {"half_plus_two", "half_plus_three", "half_plus_two_tf2",
                          "saved_model_save", "saved_model_save_multiple_signatures"}
    assert sorted(p.name for p in built["half_plus_two"].iterdir()) == ["00000123", "00000124"]
    for name in built:
        if name != "half_plus_two":
            assert [p.name for p in built[name].iterdir()] == ["00000123"], name


def test_half_plus_two_versions_are_byte_identical(built):
    base = built["half_plus_two"]
    comparison = filecmp.dircmp(base / "00000123", base / "00000124")
    assert not comparison.diff_files and not comparison.left_only and not comparison.right_only
    assert filecmp.cmp(base / "00000123/saved_model.pb", base / "00000124/saved_model.pb",
                       shallow=False)


def test_half_plus_two_signatures_match_upstream(built):
    graph = meta_graph(built["half_plus_two"] / "00000123")
    assert list(graph.meta_info_def.tags) == ["serve"]
    sigs = {k: describe(v) for k, v in graph.signature_def.items()}
    example = ("tf_example:0", STRING, [-1])
    assert sigs == {
        "serving_default": ({"x": ("x:0", FLOAT, [-1, 1])}, {"y": ("y:0", FLOAT, [-1, 1])}, PREDICT),
        "classify_x_to_y": ({"inputs": example}, {"scores": ("y:0", FLOAT, [-1, 1])}, CLASSIFY),
        "regress_x_to_y": ({"inputs": example}, {"outputs": ("y:0", FLOAT, [-1, 1])}, REGRESS),
        "regress_x_to_y2": ({"inputs": example}, {"outputs": ("y2:0", FLOAT, [-1, 1])}, REGRESS),
        "regress_x2_to_y3": ({"inputs": ("x2:0", FLOAT, [-1, 1])},
                             {"outputs": ("y3:0", FLOAT, [-1, 1])}, REGRESS),
        "classify_x2_to_y3": ({"inputs": ("x2:0", FLOAT, [-1, 1])},
                              {"scores": ("y3:0", FLOAT, [-1, 1])}, CLASSIFY),
    }


def test_half_plus_two_x_is_an_identity_not_a_placeholder(built):
    # This is what lets the C++ server (and ours) accept feeds of any shape.
    graph = meta_graph(built["half_plus_two"] / "00000123")
    ops = {node.name: node.op for node in graph.graph_def.node}
    assert ops["x"] == "Identity"
    assert ops["tf_example"] == "Placeholder"
    assert {"a", "b", "c", "a2", "c2"} <= set(ops)


def test_half_plus_three_signatures(built):
    graph = meta_graph(built["half_plus_three"] / "00000123")
    sigs = {k: describe(v) for k, v in graph.signature_def.items()}
    assert sigs["serving_default"] == (
        {"x": ("x:0", FLOAT, [-1, 1])}, {"y": ("y:0", FLOAT, [-1, 1])}, PREDICT)
    assert sigs[REGRESS][0] == {"inputs": ("tf_example:0", STRING, [-1])}
    assert sigs[REGRESS][2] == REGRESS


def test_tf2_model_signatures_and_default(built):
    graph = meta_graph(built["half_plus_two_tf2"] / "00000123")
    sigs = graph.signature_def
    expected_keys = {"serving_default", "classify_x_to_y", "regress_x_to_y", "regress_x_to_y2",
                     "regress_x2_to_y3", "classify_x2_to_y3"}
    assert expected_keys <= set(sigs)
    for key in expected_keys:
        assert sigs[key].method_name == PREDICT, key
    serving = sigs["serving_default"]
    assert (serving.inputs["x"].dtype, shape(serving.inputs["x"])) == (FLOAT, [1])
    assert list(serving.outputs) == ["y"]
    default = serving.defaults["x"]
    assert (default.dtype, [d.size for d in default.tensor_shape.dim]) == (FLOAT, [1])
    assert tf.make_ndarray(default).tolist() == [0.0]
    for key, out in (("classify_x_to_y", "scores"), ("regress_x_to_y", "outputs"),
                     ("regress_x_to_y2", "outputs")):
        assert (sigs[key].inputs["inputs"].dtype, shape(sigs[key].inputs["inputs"])) == (STRING, [-1])
        assert shape(sigs[key].outputs[out]) == [-1, 1]
    for key in ("regress_x2_to_y3", "classify_x2_to_y3"):
        assert (sigs[key].inputs["inputs"].dtype, shape(sigs[key].inputs["inputs"])) == (FLOAT, [1])


def test_saved_model_save_models(built):
    sigs = meta_graph(built["saved_model_save"] / "00000123").signature_def
    assert list(sigs["serving_default"].inputs) == ["x"]
    assert list(sigs["serving_default"].outputs) == ["y"]
    multi = meta_graph(built["saved_model_save_multiple_signatures"] / "00000123").signature_def
    assert {"serving_default", "custom_signature_key"} <= set(multi)


def test_graph_models_are_deterministic(built, tmp_path):
    again = testmodels.build_test_models(tmp_path)
    for name in ("half_plus_two", "half_plus_three"):
        for path in sorted((built[name]).rglob("*")):
            if path.is_file():
                twin = again[name] / path.relative_to(built[name])
                assert filecmp.cmp(path, twin, shallow=False), path
    # tf.saved_model.save embeds traced-function names, so compare what clients see.
    for name in ("half_plus_two_tf2", "saved_model_save_multiple_signatures"):
        a = meta_graph(built[name] / "00000123").signature_def
        b = meta_graph(again[name] / "00000123").signature_def
        assert sorted(a) == sorted(b)
        for key in a:
            assert (describe(a[key])[2], sorted(a[key].inputs), sorted(a[key].outputs)) == (
                describe(b[key])[2], sorted(b[key].inputs), sorted(b[key].outputs))


def test_addk_signatures_versions_and_size(tmp_path):
    base = testmodels.build_addk(tmp_path, 7, size_bytes=3_000_000, versions=(1, 2))
    assert base == tmp_path / "addk_7"
    assert sorted(p.name for p in base.iterdir()) == ["1", "2"]
    for version in ("1", "2"):
        size = testmodels.size_on_disk(base / version)
        assert 3_000_000 <= size <= 3_000_000 * 1.05, size
        sigs = meta_graph(base / version).signature_def
        assert describe(sigs["serving_default"]) == (
            {"x": ("x:0", FLOAT, None)}, {"y": ("y:0", FLOAT, None)}, PREDICT)
        assert describe(sigs["version"]) == ({}, {"version": ("version:0", INT64, [])}, PREDICT)


def test_addk_without_padding_is_small(tmp_path):
    base = testmodels.build_addk(tmp_path, 1)
    assert testmodels.size_on_disk(base / "1") < 50_000


def test_corrupt_model_does_not_parse(tmp_path):
    base = testmodels.build_corrupt(tmp_path, "broken", version=3)
    assert base == tmp_path / "broken"
    data = (base / "3" / "saved_model.pb").read_bytes()
    with pytest.raises(Exception):
        saved_model_pb2.SavedModel().ParseFromString(data)


def test_make_models_script(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "make_models.py"
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--synthetic", "2", "--size-mb", "0.5"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = [line.split("\t")[0] for line in result.stdout.splitlines()]
    assert names == ["half_plus_two", "half_plus_three", "half_plus_two_tf2", "saved_model_save",
                     "saved_model_save_multiple_signatures", "addk_1", "addk_2"]
    assert (tmp_path / "half_plus_two" / "00000124" / "saved_model.pb").is_file()
    assert 500_000 <= testmodels.size_on_disk(tmp_path / "addk_2" / "1") <= 550_000


def test_gate_signatures(tmp_path):
    base = testmodels.build_gate(tmp_path, versions=(1, 2))
    assert sorted(p.name for p in base.iterdir()) == ["1", "2"]
    sigs = meta_graph(base / "1").signature_def
    assert describe(sigs["serving_default"]) == ({}, {"value": ("dequeued:0", FLOAT, [])}, PREDICT)
    assert describe(sigs["release"]) == (
        {"value": ("value:0", FLOAT, [])}, {"value": ("released:0", FLOAT, [])}, PREDICT)
