"""Async client for one Triton node's repository API (Open Inference Protocol, gRPC), with deadlines.

It speaks the wire-compatible messages of ``tfscache.wire.oip_repository`` over raw
method paths (``/inference.GRPCInferenceService/RepositoryIndex`` ...), so it needs
neither tritonclient nor Triton's generated code. gRPC errors are translated here, once,
into the ``tfscache.errors`` tree, keeping Triton's message word for word: Triton maps
its own status codes one-to-one to gRPC's (docs/upstream/triton.md, "Error texts and codes
(measured on 2.51.0)"), so INVALID_ARGUMENT
"load failed for model 'X': ..." stays an InvalidArgument carrying that text.

Every call has a deadline: a load has no timeout on Triton's side (docs/upstream/triton.md,
"Load: blocking, idempotence, reload"), so the
caller's deadline is the only one there is. RepositoryModelLoad returns once Triton finished
loading the name (its version policy's versions); a failed load is INVALID_ARGUMENT ``load
failed for model 'NAME': version N is at UNAVAILABLE state: ...``. RepositoryModelUnload
returns once no version is READY, *before* the model is gone ("Unload: asynchronous"). Liveness is
ServerLive, not /ready: one failed model poisons that ("Hazards a caching manager must defuse").
"""

from __future__ import annotations

from tfscache import errors
from tfscache.kinds.oip.repository import OipRepositoryChannel

# Triton's index states (model_lifecycle.cc) and the reason of a completed unload.
READY = "READY"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
UNAVAILABLE = "UNAVAILABLE"
UNLOADED_REASON = "unloaded"


class OipClient(OipRepositoryChannel):
    """Health, readiness and repository calls to the Triton node at ``target`` ("host:port")."""

    async def model_ready(
        self, name: str, version: str = "", deadline_s: float | None = None
    ) -> bool:
        """ModelReady; False for an unknown name (Triton's HEAD answers NOT_FOUND for those, 2.51
        ready=false)."""
        try:
            return await self.ready(name, version, deadline_s)
        except errors.NotFound:
            return False
