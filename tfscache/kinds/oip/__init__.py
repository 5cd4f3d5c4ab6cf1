"""What the node kinds that speak the Open Inference Protocol share (Triton and MLServer).

repository.py (the repository extension over gRPC: ServerLive, ModelReady, RepositoryIndex,
RepositoryModelLoad, RepositoryModelUnload), turns.py (one lock per model name), adapter.py (the
NodeAdapter both kinds build on: sync, load, unload bookkeeping, deadlines and their texts, loads
that passed their deadline). Each kind's package keeps its dialect: how its index writes states,
how it answers "not loaded", how a load is confirmed and an unload awaited.
"""
