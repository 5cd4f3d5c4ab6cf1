"""Helpers for the cache-manager tests (fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc, predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from support.waiting import until
from tfscache.kinds.tfserving.client import NodeClient

NUM_MODELS = 12
MODEL_BYTES = 200_000  # the padding variable; each version directory is a little larger

NODE_FLAGS = ["--file_system_poll_wait_seconds=0.1", "--max_num_load_retries=0", "--num_load_threads=4"]


class RecordingClient(NodeClient):
    """A NodeClient that records every config it sends: a list of {name: versions}."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reloads: list[dict[str, tuple[int, ...]]] = []
        self.on_reload = None  # called with the config's {name: versions} before it is sent

    async def reload(self, config, deadline_s=None) -> None:
        sent = {m.name: tuple(m.model_version_policy.specific.versions) for m in config.model_config_list.config}
        self.reloads.append(sent)
        if self.on_reload is not None:
            self.on_reload(sent)
        await super().reload(config, deadline_s)

    def loads_of(self, name: str) -> int:
        """How many reloads added ``name`` to a config that lacked it."""
        count, before = 0, {}
        for config in self.reloads:
            if name in config and name not in before:
                count += 1
            before = config
        return count


class Gate:
    """The node's --load_gate_dir: hold a model's loads open, or make them fail."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def hold(self, name: str) -> None:
        (self.dir / f"{name}.hold").touch()

    def release(self, name: str) -> None:
        (self.dir / f"{name}.hold").unlink(missing_ok=True)

    def fail(self, name: str) -> None:
        (self.dir / f"{name}.fail").touch()

    def unfail(self, name: str) -> None:
        (self.dir / f"{name}.fail").unlink(missing_ok=True)

    def waiting(self, name: str, version: int = 1) -> bool:
        return (self.dir / f"{name}.{version}.waiting").exists()

    async def wait_until_waiting(self, name: str, version: int = 1, timeout: float = 30.0) -> None:
        await until(lambda: self.waiting(name, version), timeout, f"{name} load to reach the gate")

    def clear(self) -> None:
        for path in self.dir.iterdir():
            path.unlink()


def node_status(target: str, name: str) -> dict[int, tuple[int, int, str]]:
    """version -> (state, error_code, error_message), from the node's own GetModelStatus."""
    with grpc.insecure_channel(target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        try:
            response = stub.GetModelStatus(request, timeout=10)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return {}
            raise
    return {s.version: (s.state, s.status.error_code, s.status.error_message)
            for s in response.model_version_status}


class AsyncNode:
    """Async TF Serving stubs on one node: status of many models, Predict on addk models."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.predictions = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    async def states(self, name: str) -> dict[int, tuple[int, int, str]]:
        """version -> (state, error_code, error_message); {} when the node never heard of it."""
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        try:
            response = await self.models.GetModelStatus(request, timeout=10)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return {}
            raise
        return {s.version: (s.state, s.status.error_code, s.status.error_message)
                for s in response.model_version_status}

    async def state(self, name: str, version: int = 1) -> str:
        """The version's state name ("AVAILABLE", "END", ...), or "NONE"."""
        found = (await self.states(name)).get(version)
        return "NONE" if found is None else get_model_status_pb2.ModelVersionStatus.State.Name(found[0])

    async def available(self, names) -> set[str]:
        """Names with a version AVAILABLE right now."""
        async def one(name):
            request = get_model_status_pb2.GetModelStatusRequest()
            request.model_spec.name = name
            try:
                response = await self.models.GetModelStatus(request, timeout=10)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise
            return name if any(s.state == 30 for s in response.model_version_status) else None

        return {n for n in await asyncio.gather(*(one(n) for n in names)) if n}

    async def add(self, name: str, version: int, x: float) -> float:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = name
        request.model_spec.version.value = version
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[x])
        tensor.tensor_shape.dim.add(size=1)
        request.inputs["x"].CopyFrom(tensor)
        response = await self.predictions.Predict(request, timeout=30)
        return response.outputs["y"].float_val[0]

    async def close(self) -> None:
        await self.channel.close()


class CapSampler:
    """Samples the node's own GetModelStatus for every model, over and over, in the background.

    One sample is a forward sweep over the models followed at once by a backward sweep.
    A model seen resident (START, LOADING, AVAILABLE or UNLOADING) in both sweeps was
    resident for the whole span between its two queries, and every such span contains
    the instant the forward sweep ended; so those models were resident together at that
    instant, and their count is a sound lower bound on what the node held then. (A model
    cannot go END and load again within one sample: a load waits for a file-system poll.)
    """

    RESIDENT = {10, 20, 30, 40}  # START, LOADING, AVAILABLE, UNLOADING

    def __init__(self, anode: AsyncNode, names: list[str]) -> None:
        self.anode = anode
        self.names = names
        self.samples: list[set[str]] = []
        self._stop = asyncio.Event()

    async def _resident(self, name: str) -> bool:
        return any(state in self.RESIDENT for state, _, _ in (await self.anode.states(name)).values())

    async def run(self) -> None:
        while not self._stop.is_set():
            forward = [name for name in self.names if await self._resident(name)]
            backward = [name for name in reversed(self.names) if await self._resident(name)]
            self.samples.append(set(forward) & set(backward))
            await asyncio.sleep(0.01)  # pacing: leave the node's GIL to the traffic under test

    def stop(self) -> None:
        self._stop.set()

    @property
    def peak(self) -> int:
        return max(map(len, self.samples), default=0)
