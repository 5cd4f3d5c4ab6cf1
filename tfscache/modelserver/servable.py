"""One loaded SavedModel version with TF1 session semantics, as the C++ server runs it.

``load_servable`` loads a SavedModel (TF1 graph or TF2 ``tf.saved_model.save``) into
a private ``tf.Graph`` and ``tf.compat.v1.Session`` with
``tf.compat.v1.saved_model.loader.load``. ``Servable.run`` feeds and fetches by
tensor name, like ``Session::Run`` in tensorflow_model_server:

* any feed shape the graph accepts: Python's ``Session.run`` refuses a feed whose
  shape differs from the tensor's static shape ([1] into a [-1,1] tensor); the C++
  session does not, and clients rely on it. So ``run`` calls the C API
  (``TF_SessionRun``) directly, which skips that Python-only check;
* a dtype mismatch is reported as TF's ``FunctionCallFrame`` does:
  ``Expects arg[0] to be float but string is provided``;
* ``timeout_s`` becomes ``RunOptions.timeout_in_ms`` (the client deadline, as
  ``enforce_session_run_timeout`` does).

Runs are thread-safe: a TF session runs many steps at once.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, saved_model_pb2
from tensorflow.python.client import pywrap_tf_session as tf_session

from tfscache import errors
from tfscache.modelserver import serving_metrics
from tfscache.modelserver.tensor_limits import element_count, shape_problem

log = logging.getLogger("tfscache.modelserver.servable")

tf1 = tf.compat.v1

SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_PBTXT = "saved_model.pbtxt"


def dtype_name(dtype: int) -> str:
    """TF's DataTypeString: DT_FLOAT -> 'float', DT_STRING -> 'string', ..."""
    name = types_pb2.DataType.Name(dtype)
    if name.endswith("_REF"):
        return dtype_name(dtype - 100) + "_ref"
    return name.removeprefix("DT_").lower()


def load_servable(name: str, version: int, path: str, *, tags=("serve",)) -> Servable:
    """Loads the SavedModel at ``path``; raises TfscacheError with TF Serving's text.

    Counted as LoadSavedModel counts (load_attempt_count, load_latency; serving_metrics.py)."""
    start = time.perf_counter()
    try:
        servable = _load(name, version, str(path), tags)
    except BaseException:
        serving_metrics.record_load(str(path), start, ok=False)
        raise
    serving_metrics.record_load(str(path), start, ok=True)
    return servable


def _load(name: str, version: int, path: str, tags) -> Servable:
    # Read first, so a missing or unparsable SavedModel gets TF Serving's own text.
    meta_graph = _read_meta_graph(path, tags)
    graph = tf.Graph()
    session = tf1.Session(graph=graph, config=_session_config())
    try:
        with graph.as_default():
            tf1.saved_model.loader.load(session, list(tags), path)
    except Exception as exc:  # TF raises many kinds; all mean "this version won't load"
        session.close()
        raise _load_error(path, exc) from exc
    graph.finalize()  # nothing adds ops after the load; runs go through the C API
    return Servable(name=name, version=int(version), path=path,
                    meta_graph_def=meta_graph, _graph=graph, _session=session)


@dataclass(eq=False)
class Servable:
    """A loaded version: ``run`` feeds by tensor name; ``unload`` frees the session."""

    name: str
    version: int
    path: str
    meta_graph_def: meta_graph_pb2.MetaGraphDef
    _graph: tf.Graph | None = field(repr=False, default=None)
    _session: tf1.Session | None = field(repr=False, default=None)
    _outputs: dict = field(repr=False, default_factory=dict)  # tensor name -> (TF_Output, dtype)
    _lock: threading.Lock = field(repr=False, default_factory=threading.Lock)

    @property
    def signature_defs(self) -> dict[str, meta_graph_pb2.SignatureDef]:
        return dict(self.meta_graph_def.signature_def)

    def run(
        self, feeds: dict, fetches: list[str], timeout_s: float | None = None
    ) -> list[np.ndarray]:
        """Runs one step: ``feeds`` maps tensor names to ndarrays or TensorProtos."""
        session = self._session
        if session is None:
            raise errors.Unavailable(f"servable {self.name} version {self.version} is unloaded")
        feed_dict = {}
        for index, (tensor_name, value) in enumerate(feeds.items()):
            output, dtype = self._tensor(tensor_name)
            array = _as_ndarray(value)
            given = dtype_of(array)
            if given != dtype:
                raise errors.InvalidArgument(
                    f"Expects arg[{index}] to be {dtype_name(dtype)} but "
                    f"{dtype_name(given)} is provided")
            feed_dict[output] = array
        fetch_list = [self._tensor(tensor_name)[0] for tensor_name in fetches]
        options = None
        if timeout_s is not None:
            run_options = config_pb2.RunOptions(timeout_in_ms=max(1, int(timeout_s * 1000)))
            options = tf_session.TF_NewBufferFromString(run_options.SerializeToString())
        try:
            # Session.run's own path would add Python's static-shape check; the C call
            # is what the C++ server does (session._session is the TF_Session handle).
            return tf_session.TF_SessionRun_wrapper(
                session._session, options, feed_dict, fetch_list, [], None)
        except tf.errors.OpError as exc:
            raise errors.error_for_code(exc.error_code, exc.message) from exc
        finally:
            if options is not None:
                tf_session.TF_DeleteBuffer(options)

    def unload(self) -> None:
        """Closes the session and drops the graph; memory goes back where TF allows."""
        session, self._session = self._session, None
        self._graph = None
        self._outputs = {}
        if session is not None:
            session.close()
            del session
        gc.collect()
        _malloc_trim()

    def _tensor(self, tensor_name: str):
        """(TF_Output, DataType enum) of a graph tensor, cached; NOT_FOUND if absent."""
        cached = self._outputs.get(tensor_name)
        if cached is None:
            graph = self._graph
            if graph is None:
                raise errors.Unavailable(f"servable {self.name} version {self.version} is unloaded")
            try:
                tensor = graph.get_tensor_by_name(tensor_name)
            except (KeyError, ValueError) as exc:
                raise errors.NotFound(
                    f"Tensor {tensor_name}, specified in either feed_devices or "
                    f"fetch_devices was not in the Graph") from exc
            cached = (tensor._as_tf_output(), tensor.dtype.base_dtype.as_datatype_enum)
            with self._lock:
                self._outputs[tensor_name] = cached
        return cached


def _as_ndarray(value) -> np.ndarray:
    if isinstance(value, tensor_pb2.TensorProto):
        array = from_proto(value)
        if array is None:
            raise errors.InvalidArgument("tensor parsing error")
        return array
    return np.asarray(value)


def dtype_of(array: np.ndarray) -> int:
    """The tensorflow.DataType enum of an ndarray (bytes/str/object -> DT_STRING)."""
    if array.dtype.kind in ("O", "S", "U"):
        return types_pb2.DT_STRING
    try:
        return tf.as_dtype(array.dtype).as_datatype_enum
    except TypeError:
        return types_pb2.DT_INVALID

# -- TensorProto <-> ndarray, as TF's Tensor::FromProto and Tensor::AsProtoField -------------

# dtype -> (typed TensorProto field, numpy dtype)
_FIELDS = {
    types_pb2.DT_FLOAT: ("float_val", np.float32),
    types_pb2.DT_DOUBLE: ("double_val", np.float64),
    types_pb2.DT_INT32: ("int_val", np.int32),
    types_pb2.DT_INT16: ("int_val", np.int16),
    types_pb2.DT_INT8: ("int_val", np.int8),
    types_pb2.DT_UINT8: ("int_val", np.uint8),
    types_pb2.DT_UINT16: ("int_val", np.uint16),
    types_pb2.DT_INT64: ("int64_val", np.int64),
    types_pb2.DT_UINT32: ("uint32_val", np.uint32),
    types_pb2.DT_UINT64: ("uint64_val", np.uint64),
    types_pb2.DT_BOOL: ("bool_val", np.bool_),
    types_pb2.DT_STRING: ("string_val", object),
    types_pb2.DT_HALF: ("half_val", np.float16),
    types_pb2.DT_BFLOAT16: ("half_val", tf.bfloat16.as_numpy_dtype),
    types_pb2.DT_COMPLEX64: ("scomplex_val", np.complex64),
    types_pb2.DT_COMPLEX128: ("dcomplex_val", np.complex128),
}
_HALVES = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16)
_COMPLEX_PARTS = {types_pb2.DT_COMPLEX64: np.float32, types_pb2.DT_COMPLEX128: np.float64}


def from_proto(proto: tensor_pb2.TensorProto) -> np.ndarray | None:
    """Tensor::FromProto: the array, or None where TF would fail to parse it.

    Typed fields with fewer values than elements repeat the last value; none gives
    zeros; extra values are ignored. ``tensor_content`` must have the exact size.
    """
    if proto.tensor_shape.unknown_rank or any(d.size < 0 for d in proto.tensor_shape.dim):
        return None
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    if shape_problem(list(shape)) is not None:
        return None  # too many dimensions, or too many elements (tensor_limits)
    try:
        return _from_proto(proto, shape, element_count(shape))
    except (MemoryError, ValueError):  # TF's failed allocation: a parse error too
        return None


def _from_proto(
    proto: tensor_pb2.TensorProto, shape: tuple[int, ...], count: int
) -> np.ndarray | None:
    entry = _FIELDS.get(proto.dtype)
    if entry is None or (proto.tensor_content and proto.dtype == types_pb2.DT_STRING):
        try:
            return tf.make_ndarray(proto) if proto.dtype != types_pb2.DT_INVALID else None
        except Exception:  # whatever TF's own converter refuses is a parse error
            return None
    field, np_dtype = entry
    if proto.tensor_content:
        itemsize = np.dtype(np_dtype).itemsize
        if len(proto.tensor_content) != count * itemsize:
            return None
        return np.frombuffer(proto.tensor_content, dtype=np_dtype).reshape(shape).copy()
    values = getattr(proto, field)
    if proto.dtype in _HALVES:
        flat = np.array(values, dtype=np.uint16).view(np_dtype)
    elif proto.dtype in _COMPLEX_PARTS:
        flat = np.array(values, dtype=_COMPLEX_PARTS[proto.dtype])
        flat = flat[: len(flat) // 2 * 2].view(np_dtype)
    elif np_dtype is object:
        flat = np.empty(len(values), dtype=object)
        flat[:] = list(values)
    else:
        flat = np.array(values, dtype=np_dtype)
    if len(flat) == 0:
        flat = (
            np.zeros(count, dtype=np_dtype)
            if np_dtype is not object
            else np.full(count, b"", object)
        )
    elif len(flat) >= count:
        flat = flat[:count]
    else:
        flat = np.concatenate([flat, np.repeat(flat[-1:], count - len(flat))])
    return flat.reshape(shape)


def to_proto_field(value, proto: tensor_pb2.TensorProto) -> tensor_pb2.TensorProto:
    """Tensor::AsProtoField: dtype, shape and the typed ``*_val`` field (no tensor_content)."""
    array = np.asarray(value)
    dtype = dtype_of(array)
    entry = _FIELDS.get(dtype)
    if entry is None:
        proto.CopyFrom(tf.make_tensor_proto(array))
        return proto
    proto.dtype = dtype
    proto.tensor_shape.SetInParent()
    for size in array.shape:
        proto.tensor_shape.dim.add().size = size
    flat = array.ravel()
    if dtype in _HALVES:
        values = flat.view(np.uint16).tolist()
    elif dtype in _COMPLEX_PARTS:
        values = flat.view(_COMPLEX_PARTS[dtype]).tolist()
    elif dtype == types_pb2.DT_STRING:
        values = [v if isinstance(v, bytes) else str(v).encode() for v in flat.tolist()]
    else:
        values = flat.tolist()
    getattr(proto, entry[0]).extend(values)
    return proto


def shape_string(array: np.ndarray) -> str:
    """TensorShape::DebugString, e.g. [2,1]."""
    return "[" + ",".join(str(d) for d in np.shape(array)) + "]"



def _session_config() -> config_pb2.ConfigProto:
    # All sessions share the process-wide thread pools (as ServerCore's sessions do),
    # so a hundred loaded models do not mean a hundred pools.
    return config_pb2.ConfigProto(allow_soft_placement=True)


def _read_meta_graph(path: str, tags) -> meta_graph_pb2.MetaGraphDef:
    """Reads saved_model.pb(txt) and picks the MetaGraphDef with exactly ``tags``."""
    pb, pbtxt = os.path.join(path, SAVED_MODEL_PB), os.path.join(path, SAVED_MODEL_PBTXT)
    saved_model = saved_model_pb2.SavedModel()
    if os.path.isfile(pb):
        with open(pb, "rb") as f:
            data = f.read()
        try:
            saved_model.ParseFromString(data)
        except DecodeError as exc:
            raise errors.DataLoss(f"Can't parse {pb} as binary proto") from exc
    elif os.path.isfile(pbtxt):
        from google.protobuf import text_format

        with open(pbtxt) as f:
            text = f.read()
        try:
            text_format.Parse(text, saved_model)
        except text_format.ParseError as exc:
            raise errors.DataLoss(f"Can't parse {pbtxt} as text proto") from exc
    else:
        raise errors.NotFound(
            "Could not find SavedModel .pb or .pbtxt at supplied export directory "
            f"path: {path}")
    wanted = set(tags)
    for meta_graph in saved_model.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == wanted:
            return meta_graph
    tag_list = " ".join(tags)
    raise errors.NotFound(
        f"Could not find meta graph def matching supplied tags: {{ {tag_list} }}. "
        "To inspect available tag-sets in the SavedModel, please use the SavedModel "
        "CLI: `saved_model_cli`")


def _load_error(path: str, exc: Exception) -> errors.TfscacheError:
    if isinstance(exc, tf.errors.OpError):
        return errors.error_for_code(exc.error_code, exc.message)
    if isinstance(exc, errors.TfscacheError):
        return exc
    log.warning("loading %s failed: %r", path, exc)
    return errors.Internal(f"Failed to load SavedModel at {path}: {exc}")


_libc = None


def _malloc_trim() -> None:
    """Returns freed heap pages to the OS (glibc), so RSS reflects an unload."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL("libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
