"""The kinds of model server behind tfscache, picked by name (``node.backend``) from ``KINDS``.

A kind says how its embedded children are started, how the cache talks to a node (the
client its node adapter uses, and the adapter's name in ``tfscache.cache.adapter.ADAPTERS``)
and which API the front ends speak:

* ``tfserving`` (default): TF Serving's PredictionService/ModelService and ``/v1`` REST; nodes
  are ``tfscache node`` children, or ``--node-command`` (the real tensorflow_model_server).
* ``triton``: NVIDIA Triton in explicit model control; the Open Inference Protocol
  (``inference.GRPCInferenceService`` and ``/v2`` REST); children are the nvidia-pytriton
  wheel's ``tritonserver`` (or ``--node-command``, another tritonserver binary) over
  ``model_repository``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tfscache.kinds.triton import launcher as tritonbin
from tfscache.frontend.protocols.tfserving import methods as tf_methods
from tfscache.frontend.protocols.oip import methods as oip_methods
from tfscache.frontend.grpc_server import REFUSED
from tfscache.frontend.protocols.oip.rest import OipRestApi
from tfscache.kinds.tfserving.client import NodeClient
from tfscache.kinds.triton.client import OipClient
from tfscache.frontend.protocols.oip import stream as oip_stream
from tfscache.settings import NodeSection
from tfscache.kinds.supervisor import NodeProcess, free_port

Launcher = Callable[[NodeProcess], tuple[list[str], dict[str, str] | None]]


@dataclass(frozen=True)
class NodeKind:
    """One kind of node, as serve.py wires it."""

    client: Callable[..., object]  # (name, *, rpc_deadline_s, channel) -> the adapter's client
    adapter: str  # its name in tfscache.cache.adapter.ADAPTERS
    grpc_methods: Mapping  # what the gRPC front end serves (path -> Method)
    grpc_refused: Mapping  # paths answered with a refusal (path -> message)
    rest_api: object | None  # the REST front end's URL scheme (None: TF Serving's /v1)
    launcher: Callable[[NodeSection, Path], Launcher | None]  # embedded children (None: tfscache node's)
    grpc_streams: Mapping = dataclasses.field(default_factory=dict)  # streaming methods (path -> handler factory)


def _triton_launcher(settings: NodeSection, repository: Path) -> Launcher:
    binary = tritonbin.find_tritonserver()  # fails at start-up, naming the install command, if absent
    if settings.node_command:
        binary = dataclasses.replace(binary, executable=Path(settings.node_command))

    def launch(node: NodeProcess) -> tuple[list[str], dict[str, str] | None]:
        node.grpc_port, node.rest_port = free_port(), free_port()  # Triton cannot report port 0
        return tritonbin.command(binary, repository, http_port=node.rest_port, grpc_port=node.grpc_port,
                                 metrics_port=free_port(), extra=settings.extra_args)

    return launch


KINDS: dict[str, NodeKind] = {
    "tfserving": NodeKind(NodeClient, "tfserving", tf_methods.METHODS, REFUSED, None, lambda s, r: None),
    "triton": NodeKind(OipClient, "triton", oip_methods.METHODS, oip_methods.REFUSED, OipRestApi,
                       _triton_launcher, grpc_streams=oip_stream.STREAMS),
}
