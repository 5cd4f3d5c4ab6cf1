"""Model warm-up as tensorflow_model_server does it (servables/tensorflow/saved_model_warmup*.cc).

``warm_up(servable, iterations)`` runs during the load, after the SavedModel is loaded and
before the version turns AVAILABLE: each record of ``<version>/assets.extra/
tf_serving_warmup_requests`` (a TFRecord file of ``PredictionLog``) is replayed
``iterations`` times through the same code as a client's request (Predict, Classify,
Regress, MultiInference). TF Serving's behaviour, kept here:

* no file: nothing to do ("No warmup data file found at PATH", INFO); warm-up is optional;
* a record that is not a ``PredictionLog``: INVALID_ARGUMENT "Failed to parse warmup
  record: RECORD from PATH"; a TFRecord file that is not one (bad length or checksum):
  DATA_LOSS with TF's reader's text and ". Please verify your warmup data is in TFRecord
  format."; more than 1000 records: INVALID_ARGUMENT "Number of warmup records exceeds the
  maximum (1000) at PATH"; a ``predict_streamed_log`` or ``session_run_log``: UNIMPLEMENTED
  "Unsupported log_type for warmup: N" (N: the oneof's field number); a replayed request
  that fails: its own error. Any of them fails the load;
* ``model_warmup_latency{model_path,status}`` (microseconds) and
  ``model_warmup_records_read{model_path,status}`` are recorded for every warm-up that found
  a file, with ``status`` as absl prints it (``OK``, ``INVALID_ARGUMENT: ...``);
* the replayed requests count in ``runtime_latency`` (they run a session), not in
  ``request_count`` (they are not requests).

The records are read with TensorFlow's own TFRecord reader, so its error texts are TF's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

from tensorflow_serving.apis import prediction_log_pb2

from tfscache import errors
from tfscache.modelserver import inference, serving_metrics

log = logging.getLogger("tfscache.modelserver.warmup")

ASSETS_EXTRA = "assets.extra"
REQUESTS_FILE = "tf_serving_warmup_requests"
MAX_RECORDS = 1000  # WarmupConsts::kMaxNumRecords
RUNNERS = {
    "predict_log": inference.predict,
    "classify_log": inference.classify,
    "regress_log": inference.regress,
    "multi_inference_log": inference.multi_inference,
}


def warmup_path(export_dir: str) -> str:
    return os.path.join(export_dir, ASSETS_EXTRA, REQUESTS_FILE)


class _OneServable:
    """What the inference functions ask for a servable: here always the one being loaded
    (TF Serving's warm-up runs on the bundle itself, whatever the record's model_spec names)."""

    def __init__(self, servable) -> None:
        self._servable = servable

    @contextlib.contextmanager
    def servable(self, spec):
        yield self._servable


def warm_up(servable, iterations: int = 1) -> int:
    """Replay the version's warm-up records; the number of records read. Raises TfscacheError
    with TF Serving's text (the load then fails)."""
    path = warmup_path(servable.path)
    if not os.path.exists(path):
        log.info("No warmup data file found at %s", path)
        return 0
    log.info(
        "Starting to read warmup data for model at %s with num_request_iterations %d",
        path,
        iterations,
    )
    start = time.perf_counter()
    read = 0
    status = "OK"
    try:
        read = _replay(_OneServable(servable), path, max(iterations, 1))
    except errors.TfscacheError as exc:
        status = f"{exc.grpc_code.name}: {exc.message}"
        raise
    finally:
        serving_metrics.record_warmup(servable.path, status, start, read)
    log.info("Finished reading warmup data for model at %s. Number of warmup records read: %d. "
             "Elapsed time (microseconds): %d.", path, read, serving_metrics.micros_since(start))
    return read


def _replay(core: _OneServable, path: str, iterations: int) -> int:
    read = 0
    for record in _records(path):
        entry = prediction_log_pb2.PredictionLog()
        try:
            entry.ParseFromString(record)
        except Exception as exc:  # protobuf's DecodeError, or a RuntimeWarning turned error
            raise errors.InvalidArgument(
                f"Failed to parse warmup record: {record.decode('utf-8', 'replace')} from {path}"
            ) from exc
        for _ in range(iterations):
            _run(core, entry)
        read += 1
        if read > MAX_RECORDS:  # checked after the record ran, as TF Serving does
            raise errors.InvalidArgument(
                f"Number of warmup records exceeds the maximum ({MAX_RECORDS}) at {path}"
            )
    return read


def _run(core: _OneServable, entry: prediction_log_pb2.PredictionLog) -> None:
    kind = entry.WhichOneof("log_type")
    if kind is None:
        return  # no log type: nothing to run (RunWarmupRequest's default case)
    runner = RUNNERS.get(kind)
    if runner is None:
        number = entry.DESCRIPTOR.fields_by_name[kind].number
        raise errors.Unimplemented(f"Unsupported log_type for warmup: {number}")
    request = getattr(entry, kind).request
    if kind != "multi_inference_log" and not request.HasField("model_spec"):
        request.model_spec.SetInParent()  # the C++ Run* functions do not ask for one
    runner(core, request)


def _records(path: str):
    """The file's records, by TensorFlow's TFRecord reader; a damaged file is DATA_LOSS."""
    # the node imports it anyway; keep this module light to read
    import tensorflow as tf  # noqa: PLC0415

    try:
        yield from tf.compat.v1.io.tf_record_iterator(path)
    except tf.errors.DataLossError as exc:
        raise errors.DataLoss(
            f"{exc.message}. Please verify your warmup data is in TFRecord format."
        ) from exc
    except tf.errors.OpError as exc:
        raise errors.Unknown(exc.message) from exc
