"""tfscache's admin API: what each node's cache holds, pin/unpin, preload, evict, drain.

* ``operations.AdminOperations``: the operations over a ``tfscache.cluster.topology.Topology``'s local
  nodes (no transport).
* ``drain.Drainer``: draining one local node, or the whole process (which then exits 0).
* ``server``: the gRPC service ``tfscache.admin.Admin`` (protos/tfscache/wire/admin.proto),
  its token check and bind rule (``AdminServer``).
* ``lifecycle.Lifecycle``: health, drainer and admin server of one ``tfscache serve``, and its
  shutdown sequence (``ServeApp`` builds it from typed pieces, never handing itself over).
* ``client.AdminClient``: a small blocking client, used by ``tfscache models|pin|...``
  (tfscache/cli/admin.py), ``tfscache prewarm`` and ``tfscache drain``.
"""
