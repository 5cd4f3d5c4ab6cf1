"""The Open Inference Protocol (KServe v2): gRPC methods, /v2 REST URLs, the readiness probe."""
