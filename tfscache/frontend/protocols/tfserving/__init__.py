"""TF Serving's API: PredictionService/ModelService methods, /v1 REST URLs, the status probe."""
