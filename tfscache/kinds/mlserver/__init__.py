"""The mlserver node kind: Seldon MLServer behind the cache (docs/mlserver.md).

client.py (its repository API over gRPC), adapter.py (the NodeAdapter, on tfscache.kinds.oip's
base), launcher.py (``mlserver start`` children, preflight); its protocol is
``tfscache.frontend.protocols.oip.mlserver``.
"""
