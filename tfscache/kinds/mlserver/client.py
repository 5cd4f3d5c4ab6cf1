"""Async client for one MLServer node's repository API (Open Inference Protocol, gRPC), with deadlines.

MLServer 1.7 serves Triton's repository extension inside ``inference.GRPCInferenceService``
(RepositoryIndex, RepositoryModelLoad, RepositoryModelUnload), with Triton's messages, so this
client sends the wire-compatible messages of ``tfscache.wire.oip_repository`` by method path:
no mlserver, no tritonclient. What differs from Triton, as measured against MLServer 1.7.1
(docs/mlserver.md, "Behaviour"):

* index states are written as Python enum names over gRPC ("State.READY"); they are read here
  as the names alone (READY, UNAVAILABLE, and UNKNOWN for a model registered but still loading);
* a load and an unload return once they are done, in every inference worker;
* errors: MLServer's ``MLServerError`` statuses map 404 -> NOT_FOUND ("Model NAME not found"),
  400 -> INVALID_ARGUMENT, 422 -> FAILED_PRECONDITION, 500 -> INTERNAL; any other exception in a
  load (a model file that does not parse) is INTERNAL with the exception's text;
* ModelReady for a model not loaded is UNKNOWN "Unexpected <class 'mlserver.errors.ModelNotFound'>:
  Model NAME with version V not found" (not ready = false): ``model_ready`` reads it as false.
"""

from __future__ import annotations

from tfscache import errors
from tfscache.kinds.oip.repository import ModelIndex, OipRepositoryChannel

# MLServer's index states (mlserver.types.State); UNKNOWN: registered, not ready yet (loading).
READY = "READY"
UNKNOWN = "UNKNOWN"
UNAVAILABLE = "UNAVAILABLE"
NOT_FOUND_CLASS = "mlserver.errors.ModelNotFound"


class MLServerClient(OipRepositoryChannel):
    """Health, readiness and repository calls to the MLServer node at ``target`` ("host:port").

    A load returns once every version of the name in the repository loaded (NOT_FOUND ``Model
    NAME not found`` when no ``model-settings.json`` names it; a failed load is INTERNAL with the
    runtime's exception text, and MLServer drops the model again); an unload returns once every
    version is unloaded in every worker (NOT_FOUND when none is loaded)."""

    async def index(self, ready: bool = False, deadline_s: float | None = None) -> list[ModelIndex]:
        """RepositoryIndex: one entry per ``model-settings.json`` under the repository (only READY
        ones if ``ready``), with the state as a bare name (READY, UNAVAILABLE, UNKNOWN)."""
        return [
            ModelIndex(
                name=m.name, version=m.version, state=m.state.rpartition(".")[2], reason=m.reason
            )
            for m in await super().index(ready, deadline_s)
        ]

    async def model_ready(
        self, name: str, version: str = "", deadline_s: float | None = None
    ) -> bool:
        """ModelReady; False for a model (or version) not loaded (MLServer answers UNKNOWN for those)."""
        try:
            return await self.ready(name, version, deadline_s)
        except (errors.NotFound, errors.Unknown) as e:
            if isinstance(e, errors.Unknown) and NOT_FOUND_CLASS not in e.message:
                raise
            return False
