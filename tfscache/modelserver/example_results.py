"""Classify and Regress on tf.Examples: TF Serving's signature checks and result building.

inference.py's ``classify``, ``regress`` and ``multi_inference`` run a servable on the
serialized examples of a request; the steps around that run are TF Serving's
sv/classifier.cc and sv/regressor.cc, reproduced here with their error texts:

* ``classification_targets`` / ``regression_targets``: PreProcessClassification /
  PreProcessRegression (which tensors to feed and fetch);
* ``serialized_examples``: InputToSerializedExampleTensor;
* ``classification_result`` / ``regression_result``: PostProcessClassificationResult /
  PostProcessRegressionResult, into the response's result message.
"""

from __future__ import annotations

import numpy as np
from google.protobuf import text_format
from tensorflow.core.framework import types_pb2

from tfscache import errors
from tfscache.modelserver.servable import dtype_of, shape_string


def classification_targets(signature) -> tuple[str, list[str]]:
    """PreProcessClassification: (input tensor name, [classes name, scores name]), or TF's error."""
    if len(signature.inputs) != 1:
        raise errors.InvalidArgument("Expected one input Tensor.")
    if len(signature.outputs) not in (1, 2):
        raise errors.InvalidArgument(
            f"Expected one or two output Tensors, found {len(signature.outputs)}")
    if "inputs" not in signature.inputs:
        raise errors.InvalidArgument(
            f"No classification inputs found in SignatureDef: {text_format.MessageToString(signature)}"
        )
    outputs = [signature.outputs[k].name for k in ("classes", "scores") if k in signature.outputs]
    if not outputs:
        raise errors.InvalidArgument(
            'Expected classification signature outputs to contain at least one of "classes" '
            f'or "scores". Signature was: {text_format.MessageToString(signature)}')
    return signature.inputs["inputs"].name, outputs


def regression_targets(signature) -> tuple[str, list[str]]:
    """PreProcessRegression: (input tensor name, [outputs name])."""
    if len(signature.inputs) != 1:
        raise errors.InvalidArgument("Expected one input Tensor.")
    if len(signature.outputs) != 1:
        raise errors.InvalidArgument("Expected one output Tensor.")
    if "inputs" not in signature.inputs:
        raise errors.InvalidArgument(
            f"No regression inputs found in SignatureDef: {text_format.MessageToString(signature)}")
    if "outputs" not in signature.outputs:
        raise errors.InvalidArgument(
            f"No regression outputs found in SignatureDef: {text_format.MessageToString(signature)}"
        )
    return signature.inputs["inputs"].name, [signature.outputs["outputs"].name]


def serialized_examples(request_input) -> np.ndarray:
    """InputToSerializedExampleTensor: a 1-D string array of serialized tf.Examples."""
    kind = request_input.WhichOneof("kind")
    if kind == "example_list":
        examples = [e.SerializeToString() for e in request_input.example_list.examples]
    elif kind == "example_list_with_context":
        with_context = request_input.example_list_with_context
        context = with_context.context.SerializeToString()
        examples = [context + e.SerializeToString() for e in with_context.examples]
    else:
        examples = []
    if not examples:
        raise errors.InvalidArgument("Input is empty.")
    array = np.empty(len(examples), dtype=object)
    array[:] = examples
    return array


def classification_result(signature, num_examples, output_names, outputs, result) -> None:
    """PostProcessClassificationResult."""
    if len(outputs) != len(output_names):
        raise errors.InvalidArgument(
            f"Expected {len(output_names)} output tensor(s).  Got: {len(outputs)}")
    by_name = dict(zip(output_names, (np.asarray(o) for o in outputs)))
    classes = (
        by_name.get(signature.outputs["classes"].name) if "classes" in signature.outputs else None
    )
    scores = (
        by_name.get(signature.outputs["scores"].name) if "scores" in signature.outputs else None
    )
    for label, tensor, want in (("classes", classes, types_pb2.DT_STRING),
                                ("scores", scores, types_pb2.DT_FLOAT)):
        if tensor is None:
            continue
        if tensor.ndim != 2:
            raise errors.InvalidArgument(
                "Expected Tensor shape: [batch_size num_classes] but got "
                f"{shape_string(tensor)}")
        dtype = dtype_of(tensor)
        if dtype != want:
            raise errors.InvalidArgument(
                f"Expected {label} Tensor of {types_pb2.DataType.Name(want)}. "
                f"Got: {types_pb2.DataType.Name(dtype)}")
        if tensor.shape[0] != num_examples:
            raise errors.InvalidArgument(
                f"Expected {label} output batch size of {num_examples}. Got: {tensor.shape[0]}")
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise errors.InvalidArgument(
            "Tensors class and score should match in dim_size(1). Got "
            f"{classes.shape[1]} vs. {scores.shape[1]}")
    present = classes if classes is not None else scores
    num_classes = present.shape[1] if present is not None else 0
    for i in range(num_examples):
        classifications = result.classifications.add()
        for c in range(num_classes):
            cls = classifications.classes.add()
            if classes is not None:
                label = classes[i, c]
                cls.label = (
                    label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
                )
            if scores is not None:
                cls.score = float(scores[i, c])


def regression_result(signature, num_examples, output_names, outputs, result) -> None:
    """PostProcessRegressionResult."""
    if len(outputs) != len(output_names):
        raise errors.InvalidArgument(
            "Expected output_tensors and output_tensor_names to have the same size.")
    if "outputs" not in signature.outputs:
        raise errors.FailedPrecondition(
            f"No regression outputs found in SignatureDef: {text_format.MessageToString(signature)}"
        )
    name = signature.outputs["outputs"].name
    if name not in output_names:
        raise errors.InvalidArgument(f"Could not find output tensor '{name}'")
    tensor = np.asarray(outputs[output_names.index(name)])
    if not (tensor.ndim == 1 or (tensor.ndim == 2 and tensor.shape[1] == 1)):
        raise errors.InvalidArgument(
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] "
            f"but got {shape_string(tensor)}")
    if num_examples != tensor.shape[0]:
        raise errors.InvalidArgument(
            "Input batch size did not match output batch size: "
            f"{num_examples} vs. {tensor.shape[0]}")
    dtype = dtype_of(tensor)
    if dtype != types_pb2.DT_FLOAT:
        raise errors.InvalidArgument(
            f"Expected output Tensor of DT_FLOAT.  Got: {types_pb2.DataType.Name(dtype)}")
    if tensor.size != num_examples:
        raise errors.InvalidArgument(
            f"Expected output batch size to be {num_examples}.  Got: {tensor.size}")
    for value in tensor.ravel().tolist():
        result.regressions.add().value = value
