"""tfscache's TF-Serving-compatible front ends: gRPC and REST adapters over one Router.

``methods`` reads the routing key (the ModelSpec) from request bytes; ``router``
picks a backend over the ring and forwards bytes unchanged; ``grpc_server`` and
``rest`` are thin transports over the router. No tensorflow is imported here.
"""
