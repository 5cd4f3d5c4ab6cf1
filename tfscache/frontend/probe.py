"""Status probes answered without loading: a readiness probe never churns the cache.

A model server that loads every configured model at start-up answers a status probe
(TF Serving's GetModelStatus or ``GET /v1/models/NAME``, the Open Inference Protocol's
ModelReady) for any model it has. Through tfscache such a poll must not load the model:
thousands of probes would evict the models in use. So a status request for a version that
is not on its node is answered by the front end, by one rule for every protocol: the
version a request would get (the one asked for, else the highest on disk) is serving, since
a request for it loads it; while a failed load of it backs off (``cache.failure_backoff_s``)
it is failed with that load's error, which is what a request would get. A version that is
loading or resident is answered by its node, in its own words.

``ProbeAnswer`` is that rule's result; each protocol words it (``Method.probe``, and the
REST API's probe): tfscache.frontend.protocols.*.probe.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfscache import errors


@dataclass(frozen=True)
class ProbeAnswer:
    """A status answer for ``version``, which a request would load (or get ``failure`` for)."""

    version: int
    failure: errors.TfscacheError | None = None
