"""Demotion within a Triton node: a model leaves the GPU for CPU instances and keeps answering.

Triton's repository load takes a ``config`` override, a whole model configuration in JSON that
replaces the one on disk. When the override changes only ``instance_group``, core's
``ConfigChangeRequiresReload`` (``src/model_config_utils.cc``) says no reload is needed and the
model lifecycle updates the model in place: it stays READY, serves throughout, and its instances
are swapped for the new group's (docs/upstream/triton.md, "Instance groups change in place").

* **demote** = a load with the model's own configuration, its ``instance_group`` replaced by one
  group of ``KIND_CPU`` instances (``cache.demote_cpu_instances``);
* **promote** = a load with the model's own configuration, as Triton reported it
  (``GET /v2/models/NAME/config``) right after the cache's last plain load of the model.

An override sticks (a later plain load keeps it; docs/upstream/triton.md): promotion therefore
sends the own configuration back as an override, and an unload ends the override (Triton forgets
it with the model). The own configuration is read over Triton's HTTP port, the one API that
answers it in the JSON the override takes. A model whose backend cannot run on CPU (TensorRT
plans, TensorRT-LLM) is never demoted.
"""

from __future__ import annotations

import copy
import json
import logging

import aiohttp

from tfscache import errors

log = logging.getLogger("tfscache.cache")

# Backends and platforms that need a GPU to run at all: never demoted (docs/tiers.md).
GPU_ONLY = frozenset({"tensorrt_plan", "tensorrt", "tensorrtllm"})


class InPlaceTiers:
    """The own configurations of one Triton node's models, and the overrides that move them."""

    def __init__(self, node: str, rest_address: str, cpu_instances: int) -> None:
        """``rest_address``: the node's HTTP port ("host:port"); ``cpu_instances``: the count of
        ``KIND_CPU`` instances a demoted model runs on."""
        self.node = node
        self.base = f"http://{rest_address}"
        self.cpu_instances = cpu_instances
        self._own: dict[str, dict] = {}  # name -> its configuration as loaded from disk

    def can_demote(self, name: str) -> bool:
        """Whether ``name``'s own configuration is known and its backend runs on CPU."""
        config = self._own.get(name)
        return config is not None and not ({config.get("backend"), config.get("platform")}
                                           & GPU_ONLY)

    async def learn(self, name: str, deadline_s: float) -> None:
        """Just after a plain load of ``name``: remember its own configuration (a model whose
        configuration cannot be read is not demoted; the load stands)."""
        try:
            self._own[name] = await self._config(name, deadline_s)
        except errors.TfscacheError as e:
            self._own.pop(name, None)
            log.warning("node %s: cannot read the configuration of model %s (%s); it will be "
                        "unloaded rather than demoted", self.node, name, e.message)

    def forget(self, name: str) -> None:
        """``name`` left the node: the next load reads the disk again."""
        self._own.pop(name, None)

    def override(self, name: str, to_host: bool) -> str:
        """The JSON configuration a load sends to move ``name``: to CPU instances (``to_host``) or
        back to its own instance groups."""
        own = self._own.get(name)
        if own is None:
            raise errors.FailedPrecondition(
                f"model {name} cannot change tiers on node {self.node}: its own configuration "
                "is not known (it was not loaded by this cache)")
        config = copy.deepcopy(own)
        if to_host:
            config["instance_group"] = [{"kind": "KIND_CPU", "count": self.cpu_instances}]
        return json.dumps(config)

    async def _config(self, name: str, deadline_s: float) -> dict:
        url = f"{self.base}/v2/models/{name}/config"
        try:  # a session per read: once per load, so nothing stays open between loads
            async with aiohttp.ClientSession() as http, http.get(
                    url, timeout=aiohttp.ClientTimeout(total=deadline_s)) as r:
                text = await r.text()
                if r.status != 200:
                    raise errors.FailedPrecondition(f"GET {url}: HTTP {r.status}: {text[:300]}")
                config = json.loads(text)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise errors.Unavailable(f"GET {url}: {e!r}") from None
        if not isinstance(config, dict):
            raise errors.FailedPrecondition(f"GET {url}: not a model configuration")
        return config

