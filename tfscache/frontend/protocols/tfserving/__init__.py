"""TF Serving's API: PredictionService/ModelService methods, /v1 REST URLs, the status probe."""

from __future__ import annotations

from tfscache.dataplane.config import Rules, grpc_rules, rest_rules
from tfscache.frontend.protocol import Protocol
from tfscache.frontend.protocols.tfserving.methods import (
    METHODS,
    MODEL_SERVICE,
    PREDICTION_SERVICE,
    REFUSED,
)
from tfscache.frontend.protocols.tfserving.rest import TfServingRestApi

# The data plane's hot methods: each request's field 1 is a ModelSpec (name = 1, version = 2,
# version_label = 4; tensorflow_serving/apis/model.proto). A version or label: the slow path.
DATA_PLANE = Rules(
    grpc=grpc_rules(tuple(f"/{PREDICTION_SERVICE}/{m}"
                          for m in ("Predict", "Classify", "Regress", "GetModelMetadata")),
                    name=(1, 1), pins=(((1, 2), "-m found"), ((1, 4), "-m found"))),
    rest=rest_rules("^/v1/models/[^/:]+:(predict|classify|regress)$", "path,field(4,/),field(1,:)"),
    rest_methods=tuple((verb, verb.capitalize()) for verb in ("predict", "classify", "regress")),
)

PROTOCOL = Protocol(
    "TF Serving", METHODS, REFUSED, TfServingRestApi, ("", PREDICTION_SERVICE, MODEL_SERVICE),
    data_plane=DATA_PLANE,
)
