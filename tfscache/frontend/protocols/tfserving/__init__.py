"""TF Serving's API: PredictionService/ModelService methods, /v1 REST URLs, the status probe."""

from __future__ import annotations

from tfscache.frontend.protocol import Protocol
from tfscache.frontend.protocols.tfserving.methods import (
    METHODS,
    MODEL_SERVICE,
    PREDICTION_SERVICE,
    REFUSED,
)
from tfscache.frontend.protocols.tfserving.rest import TfServingRestApi

PROTOCOL = Protocol(
    "TF Serving", METHODS, REFUSED, TfServingRestApi, ("", PREDICTION_SERVICE, MODEL_SERVICE)
)
