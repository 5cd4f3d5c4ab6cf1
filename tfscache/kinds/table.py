"""The kinds of model server behind tfscache, picked by name (``node.backend``) from ``KINDS``.

A kind is one package under ``tfscache/kinds/`` plus one row here. The row names, as
``"module:attribute"`` strings imported only when that kind is chosen (tfscache.importer),
everything kind-specific: the cache's node adapter and its client, the protocol the front
ends speak (tfscache.frontend.protocol), how embedded children start, the kind's own checks
before start-up, and the pip extra its embedded children need. Nothing outside a kind's
package and its protocol names a product; generic code asks the row.

Adding a kind: a package ``tfscache/kinds/NAME/`` with an adapter (the
``tfscache.cache.adapter.NodeAdapter`` contract), a client, a launcher and, when its API
differs from an existing protocol, a protocol under ``tfscache/frontend/protocols/``; then
one row below (docs/DESIGN.md, "Adding a node kind").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tfscache.extras import require
from tfscache.importer import import_from_string


@dataclass(frozen=True)
class NodeKind:
    """One kind of node: where each of its parts lives."""

    summary: str  # one line for --help and docs
    adapter: str  # the cache's NodeAdapter class: (client, repository, *, rpc_deadline_s, memory)
    client: str  # the node's client class: (name, *, rpc_deadline_s, channel)
    protocol: str  # the front ends' Protocol
    launcher: str  # (NodeSection, repository root) -> Launcher: how embedded children start
    # (Settings) -> None: what embedded children need, checked before anything starts
    preflight: str
    extra: str  # the pip extra embedded children need
    extra_modules: tuple[str, ...]  # its top-level modules (found without importing them)
    install: str  # the command that installs them
    # a ``tfscache.repository.local.FlatLayout``: models without version folders ("": none)
    layout: str = ""
    # its adapter moves a loaded model between the GPU and host tiers in place (cache.demote = host)
    demotes_in_place: bool = False

    def part(self, name: str) -> Any:
        """The part this kind's row names as ``name`` ("adapter", "client", ...), imported."""
        return import_from_string(getattr(self, name))

    def repository_layout(self) -> Any:
        """The kind's FlatLayout for its repository, or None (version folders only)."""
        return import_from_string(self.layout) if self.layout else None

    def require_extra(self, what: str) -> None:
        """``MissingExtra``, naming the install command, unless this kind's extra is installed."""
        require(self.extra, what, modules=self.extra_modules, install=self.install)


# The first row is the default kind.
KINDS: dict[str, NodeKind] = {
    "tfserving": NodeKind(
        "TF Serving's API: PredictionService/ModelService and /v1 REST; `tfscache node` children",
        "tfscache.kinds.tfserving.adapter:TFServingAdapter",
        "tfscache.kinds.tfserving.client:NodeClient",
        "tfscache.frontend.protocols.tfserving:PROTOCOL",
        "tfscache.kinds.tfserving.launcher:launcher",
        "tfscache.kinds.tfserving.launcher:preflight",
        "node",
        ("tensorflow", "tensorflow_serving"),
        "pip install 'tfscache[node]'",
    ),
    "triton": NodeKind(
        "NVIDIA Triton in explicit model control: the Open Inference Protocol; tritonserver children",
        "tfscache.kinds.triton.adapter:TritonAdapter",
        "tfscache.kinds.triton.client:OipClient",
        "tfscache.frontend.protocols.oip:PROTOCOL",
        "tfscache.kinds.triton.launcher:launcher",
        "tfscache.kinds.triton.launcher:preflight",
        "triton",
        ("numpy", "pytriton"),
        "pip install 'tfscache[triton]' && pip install --no-deps nvidia-pytriton==0.7.0",
        demotes_in_place=True,
    ),
    "mlserver": NodeKind(
        "Seldon MLServer (scikit-learn, XGBoost, ...): the Open Inference Protocol; "
        "`mlserver start` children",
        "tfscache.kinds.mlserver.adapter:MLServerAdapter",
        "tfscache.kinds.mlserver.client:MLServerClient",
        "tfscache.frontend.protocols.oip.mlserver:PROTOCOL",
        "tfscache.kinds.mlserver.launcher:launcher",
        "tfscache.kinds.mlserver.launcher:preflight",
        "",
        (),
        "bash scripts/install_mlserver.sh (MLServer in a virtual environment of its own: docs/mlserver.md)",
        "tfscache.kinds.mlserver.layout:LAYOUT",
    ),
}

DEFAULT_KIND = next(iter(KINDS))
