"""tfscache's admin API: what each node's cache holds, pin/unpin, preload, evict, drain.

* ``operations.Admin``: the operations over a running ``tfscache.serve.ServeApp`` (no transport).
* ``drain.Drainer``: draining one local node, or the whole process (which then exits 0).
* ``server``: the gRPC service ``tfscache.admin.Admin`` (protos/tfscache/wire/admin.proto),
  its token check and bind rule, and ``start_admin(app, ...)`` that wires it all.
* ``client.AdminClient``: a small blocking client, used by ``tfscache models|pin|...``
  (tfscache/adminctl.py) and scripts/prewarm.py, scripts/drain.py.
"""
