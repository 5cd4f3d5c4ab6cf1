"""Builds the SavedModels the tests and benchmarks serve (imports tensorflow).

* TF Serving's own test models (docs/upstream/tfserving.md, "Test SavedModels"), rebuilt
  the way the upstream generator builds them: ``half_plus_two`` (versions 00000123 and
  00000124; graph mode, tensor names ``x:0``, ``y:0``, ``tf_example:0``),
  ``half_plus_three``, ``half_plus_two_tf2`` (``tf.saved_model.save``) and the two
  small ``tf.saved_model.save`` models of the end-to-end tests.
* Synthetic ``addk_<k>`` models computing ``y = x + k``, padded to a chosen size,
  for cache tests and benchmarks; a corrupt version directory for failure tests; a
  ``gate`` model whose requests block until released, for in-flight tests.
* Warm-up files (``write_warmup``): ``assets.extra/tf_serving_warmup_requests`` of a
  version, a TFRecord file of PredictionLog records, as TF Serving replays them at load.

Everything is deterministic; the whole set builds in a few seconds.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import tensorflow as tf

log = logging.getLogger(__name__)

tf1 = tf.compat.v1

HALF_PLUS_TWO_VERSIONS = ("00000123", "00000124")
CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
PREDICT = "tensorflow/serving/predict"


def build_test_models(dest: Path) -> dict[str, Path]:
    """Builds TF Serving's test models under ``dest``; returns name -> base path."""
    dest = Path(dest)
    models = {
        "half_plus_two": _build_half_plus_two(dest / "half_plus_two"),
        "half_plus_three": _build_half_plus_three(dest / "half_plus_three"),
        "half_plus_two_tf2": _build_half_plus_two_tf2(dest / "half_plus_two_tf2"),
        "saved_model_save": _build_saved_model_save(dest / "saved_model_save"),
        "saved_model_save_multiple_signatures": _build_multiple_signatures(
            dest / "saved_model_save_multiple_signatures"),
    }
    log.info("built test models in %s: %s", dest, ", ".join(models))
    return models


def build_addk(dest_base: Path, k: int, size_bytes: int = 0, versions=(1,)) -> Path:
    """Builds model ``addk_<k>`` (``y = x + k``) under ``dest_base``; returns its base path.

    ``serving_default``: ``x`` (``x:0``, float, unknown shape) -> ``y`` (``y:0``).
    Signature ``version``: no inputs -> ``version`` (int64 scalar), so tests can tell
    versions apart. A float32 variable of ``size_bytes`` pads the variables file,
    so the version directory and the RSS after a load grow by about that much.
    """
    base = Path(dest_base) / f"addk_{k}"
    for version in versions:
        export_dir = base / str(version)
        if export_dir.exists():
            shutil.rmtree(export_dir)
        graph = tf.Graph()
        with graph.as_default(), tf1.Session(graph=graph) as sess:
            x = tf1.placeholder(tf.float32, shape=None, name="x")
            y = tf.identity(x + tf.constant(float(k)), name="y")
            v = tf.constant(int(version), dtype=tf.int64, name="version")
            if size_bytes > 0:
                # Filled by an op (not a constant) so saved_model.pb stays small; a
                # deterministic non-zero pattern so no layer can elide the bytes.
                n = max(1, size_bytes // 4)
                tf1.Variable(tf.fill([n], 1.0 + k), name="padding", trainable=False)
            sess.run(tf1.global_variables_initializer())
            signatures = {
                "serving_default": _signature({"x": x}, {"y": y}, PREDICT),
                "version": _signature({}, {"version": v}, PREDICT),
            }
            _save_graph(sess, export_dir, signatures)
    return base


def write_warmup(version_dir: Path, records) -> Path:
    """``version_dir/assets.extra/tf_serving_warmup_requests``: each of ``records`` (PredictionLog
    messages, or raw bytes for a bad record) as one TFRecord record. Returns the file."""
    path = Path(version_dir) / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record if isinstance(record, bytes) else record.SerializeToString())
    return path


def warmup_logs(name: str) -> list:
    """One PredictionLog of each kind TF Serving replays, for ``half_plus_two``'s signatures:
    Predict (serving_default), Classify (classify_x_to_y), Regress (regress_x_to_y) and
    MultiInference (regress_x_to_y and classify_x_to_y)."""
    from tensorflow_serving.apis import (classification_pb2, inference_pb2, predict_pb2, prediction_log_pb2,
                                         regression_pb2)

    def examples(target) -> None:
        example = target.example_list.examples.add()
        example.features.feature["x"].float_list.value.append(2.0)

    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = name
    predict.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0]], dtype=tf.float32))
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name, classify.model_spec.signature_name = name, "classify_x_to_y"
    examples(classify.input)
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name, regress.model_spec.signature_name = name, "regress_x_to_y"
    examples(regress.input)
    multi = inference_pb2.MultiInferenceRequest()
    for signature, method in (("regress_x_to_y", REGRESS), ("classify_x_to_y", CLASSIFY)):
        task = multi.tasks.add()
        task.model_spec.name, task.model_spec.signature_name, task.method_name = name, signature, method
    examples(multi.input)
    log = prediction_log_pb2.PredictionLog
    return [log(predict_log=prediction_log_pb2.PredictLog(request=predict)),
            log(classify_log=prediction_log_pb2.ClassifyLog(request=classify)),
            log(regress_log=prediction_log_pb2.RegressLog(request=regress)),
            log(multi_inference_log=prediction_log_pb2.MultiInferenceLog(request=multi))]


def build_corrupt(dest_base: Path, name: str, version: int = 1) -> Path:
    """A model whose version directory holds a garbage saved_model.pb; returns its base path."""
    base = Path(dest_base) / name
    export_dir = base / str(version)
    export_dir.mkdir(parents=True, exist_ok=True)
    (export_dir / "saved_model.pb").write_bytes(b"\xff\xff\xff this is not a SavedModel \x00\x01")
    return base


def build_gate(dest_base: Path, name: str = "gate", versions=(1,)) -> Path:
    """A model whose requests can be held open on purpose (deterministic in-flight tests).

    Signature ``serving_default`` (no inputs) -> ``value`` (float scalar) blocks inside
    the session until a value is queued; signature ``release``: ``value`` (float scalar)
    -> ``value`` queues one value, releasing one waiting ``serving_default`` request
    (or the next one). The queue lives in the loaded servable's session.
    """
    base = Path(dest_base) / name
    for version in versions:
        export_dir = base / str(version)
        if export_dir.exists():
            shutil.rmtree(export_dir)
        graph = tf.Graph()
        with graph.as_default(), tf1.Session(graph=graph) as sess:
            queue = tf1.FIFOQueue(1000, tf.float32, shapes=[[]], name="gate")
            value = tf1.placeholder(tf.float32, shape=[], name="value")
            with tf.control_dependencies([queue.enqueue(value)]):
                released = tf.identity(value, name="released")
            dequeued = tf.identity(queue.dequeue(), name="dequeued")
            _save_graph(sess, export_dir, {
                "serving_default": _signature({}, {"value": dequeued}, PREDICT),
                "release": _signature({"value": value}, {"value": released}, PREDICT),
            })
    return base


# -- graph-mode models (tf.compat.v1.saved_model.Builder, as upstream) -----------------


def _signature(inputs: dict, outputs: dict, method: str):
    build = tf1.saved_model.utils.build_tensor_info
    return tf1.saved_model.signature_def_utils.build_signature_def(
        {k: build(t) for k, t in inputs.items()},
        {k: build(t) for k, t in outputs.items()},
        method)


def _save_graph(sess, export_dir: Path, signatures: dict) -> None:
    builder = tf1.saved_model.Builder(str(export_dir))
    builder.add_meta_graph_and_variables(
        sess, [tf1.saved_model.tag_constants.SERVING], signature_def_map=signatures)
    builder.save()


def _half_plus_graph(b_value: float):
    """The upstream half_plus_two graph (saved_model_half_plus_two.py) with b = b_value."""
    a = tf1.Variable(0.5, name="a")
    b = tf1.Variable(b_value, name="b")
    c = tf1.Variable(3.0, name="c")
    serialized = tf1.placeholder(tf.string, name="tf_example", shape=[None])
    features = tf1.parse_example(serialized, {
        "x": tf1.FixedLenFeature([1], dtype=tf.float32),
        "x2": tf1.FixedLenFeature([1], dtype=tf.float32, default_value=[0.0]),
    })
    x = tf.identity(features["x"], name="x")
    y = tf.identity(tf.add(tf.multiply(a, x), b), name="y")
    y2 = tf.identity(tf.add(tf.multiply(a, x), c), name="y2")
    x2 = tf.identity(features["x2"], name="x2")
    a2 = tf1.Variable(0.5, name="a2")
    c2 = tf1.Variable(3.0, name="c2")
    y3 = tf.identity(tf.add(tf.multiply(a2, x2), c2), name="y3")
    return serialized, x, y, y2, x2, y3


def _build_half_plus_two(base: Path) -> Path:
    first = base / HALF_PLUS_TWO_VERSIONS[0]
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        serialized, x, y, y2, x2, y3 = _half_plus_graph(2.0)
        sess.run(tf1.global_variables_initializer())
        _save_graph(sess, first, {
            "serving_default": _signature({"x": x}, {"y": y}, PREDICT),
            "classify_x_to_y": _signature({"inputs": serialized}, {"scores": y}, CLASSIFY),
            "regress_x_to_y": _signature({"inputs": serialized}, {"outputs": y}, REGRESS),
            "regress_x_to_y2": _signature({"inputs": serialized}, {"outputs": y2}, REGRESS),
            "regress_x2_to_y3": _signature({"inputs": x2}, {"outputs": y3}, REGRESS),
            "classify_x2_to_y3": _signature({"inputs": x2}, {"scores": y3}, CLASSIFY),
        })
    for version in HALF_PLUS_TWO_VERSIONS[1:]:  # byte-identical copies, as upstream
        shutil.copytree(first, base / version)
    return base


def _build_half_plus_three(base: Path) -> Path:
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        serialized, x, y, _, _, _ = _half_plus_graph(3.0)
        sess.run(tf1.global_variables_initializer())
        _save_graph(sess, base / "00000123", {
            "serving_default": _signature({"x": x}, {"y": y}, PREDICT),
            REGRESS: _signature({"inputs": serialized}, {"outputs": y}, REGRESS),
        })
    return base


# -- tf.saved_model.save models -------------------------------------------------------


class _HalfPlusTwo(tf.Module):
    """Upstream's saved_model_half_plus_two_tf2_cpu, saved with tf.saved_model.save."""

    def __init__(self):
        super().__init__()
        self.a = tf.Variable(0.5, name="a")
        self.b = tf.Variable(2.0, name="b")
        self.c = tf.Variable(3.0, name="c")

    def _parse(self, serialized):
        return tf.io.parse_example(serialized, {
            "x": tf.io.FixedLenFeature([1], tf.float32),
            "x2": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0]),
        })

    @tf.function(input_signature=[tf.TensorSpec([1], tf.float32, name="x")])
    def predict(self, x=tf.constant([0.0])):
        return {"y": self.a * x + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def classify_xy(self, serialized):
        return {"scores": self.a * self._parse(serialized)["x"] + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress_xy(self, serialized):
        return {"outputs": self.a * self._parse(serialized)["x"] + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress_xy2(self, serialized):
        return {"outputs": self.a * self._parse(serialized)["x"] + self.c}

    @tf.function(input_signature=[tf.TensorSpec([1], tf.float32, name="inputs")])
    def regress_x2y3(self, x2):
        return {"outputs": self.a * x2 + self.c}

    @tf.function(input_signature=[tf.TensorSpec([1], tf.float32, name="inputs")])
    def classify_x2y3(self, x2):
        return {"scores": self.a * x2 + self.c}


def _build_half_plus_two_tf2(base: Path) -> Path:
    model = _HalfPlusTwo()
    tf.saved_model.save(model, str(base / "00000123"), signatures={
        "serving_default": model.predict,  # the tf.function, so its default x=[0.0] is kept
        "classify_x_to_y": model.classify_xy.get_concrete_function(),
        "regress_x_to_y": model.regress_xy.get_concrete_function(),
        "regress_x_to_y2": model.regress_xy2.get_concrete_function(),
        "regress_x2_to_y3": model.regress_x2y3.get_concrete_function(),
        "classify_x2_to_y3": model.classify_x2y3.get_concrete_function(),
    })
    return base


def _build_saved_model_save(base: Path) -> Path:
    """test_tf_saved_model_save's model: Checkpoint(v1=3, v2=2), f(x) = {'y': v1*v2*x}."""
    root = tf.train.Checkpoint()
    root.v1 = tf.Variable(3.0)
    root.v2 = tf.Variable(2.0)
    root.f = tf.function(lambda x: {"y": root.v1 * root.v2 * x})
    to_save = root.f.get_concrete_function(tf.TensorSpec(None, tf.float32))
    tf.saved_model.save(root, str(base / "00000123"), to_save)
    return base


def _build_multiple_signatures(base: Path) -> Path:
    """test_tf_saved_model_save_multiple_signatures's model: serving_default -> {'y': 1.0},
    custom_signature_key -> {'y': 2.0}."""
    root = tf.Module()
    root.f = tf.function(lambda x: {"y": tf.constant(1.0)},
                         input_signature=[tf.TensorSpec(None, tf.float32)])
    root.g = tf.function(lambda x: {"y": tf.constant(2.0)},
                         input_signature=[tf.TensorSpec(None, tf.float32)])
    tf.saved_model.save(root, str(base / "00000123"), signatures={
        "serving_default": root.f, "custom_signature_key": root.g})
    return base


def size_on_disk(path: Path) -> int:
    """Total bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


__all__ = ["build_test_models", "build_addk", "build_corrupt", "build_gate", "size_on_disk"]
