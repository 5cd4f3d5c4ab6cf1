"""ServableStateMonitor: the last published state of every version a node has managed.

``ServingCore`` (server_core.py) publishes each state change here; nothing is ever pruned,
so GetModelStatus reports versions long unloaded, as TF Serving does. A reload waits
for the models it newly names on a fresh ``StateWaiter`` (ServerCore's
WaitUntilModelsAvailable), which records the first settled version of each.

The monitor has its own lock. ServingCore publishes while holding its own lock, so the
order is always ServingCore's lock, then the monitor's; the monitor never calls back.

    waiter = monitor.watch({"a"}, seed=True)    # before the loads start
    ...                                         # monitor.publish(name, version, state)
    monitor.wait(waiter, "model(s)", timeout_s=None)   # raises TF Serving's errors
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from tensorflow_serving.apis import get_model_status_pb2

from tfscache.errors import DeadlineExceeded, InvalidArgument, NotFound, Unknown, code_name
from tfscache.modelserver.loader_harness import ServableState, State
from tfscache.repository.local import check_name_length


@dataclass(eq=False)
class StateWaiter:
    """A fresh ServableStateMonitor that records, per awaited model, the first settled version."""

    names: set[str]
    settled: dict[str, tuple[int, ServableState]] = field(default_factory=dict)

    def observe(self, name: str, version: int, state: ServableState) -> None:
        if (
            name in self.names
            and name not in self.settled
            and state.state in (State.AVAILABLE, State.END)
        ):
            self.settled[name] = (version, state)

    @property
    def done(self) -> bool:
        return self.names <= self.settled.keys()


class StateMonitor:
    """Every version's last published state, and the reloads waiting on them."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._states: dict[str, dict[int, ServableState]] = {}
        self._waiters: list[StateWaiter] = []

    def publish(self, name: str, version: int, state: ServableState) -> None:
        with self._changed:
            self._states.setdefault(name, {})[version] = state
            for waiter in self._waiters:
                waiter.observe(name, version, state)
            self._changed.notify_all()

    def states(self, name: str) -> dict[int, ServableState]:
        """A copy of the states of a model's versions (empty if never seen)."""
        with self._changed:
            return dict(self._states.get(name, {}))

    def watch(self, names: set[str], *, seed: bool) -> StateWaiter:
        """A waiter for ``names``; ``seed``: versions that settled already count (initial load)."""
        waiter = StateWaiter(names)
        with self._changed:
            if seed:
                for name in names:
                    for version, state in sorted(self._states.get(name, {}).items(), reverse=True):
                        waiter.observe(name, version, state)
            self._waiters.append(waiter)
        return waiter

    def wait(self, waiter: StateWaiter, noun: str, timeout_s: float | None) -> None:
        """Until every awaited model settled; TF Serving's errors for a timeout or failed loads."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            try:
                while not waiter.done:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        missing = sorted(waiter.names - waiter.settled.keys())
                        raise DeadlineExceeded(
                            f"Timed out waiting for {noun} to become available: {missing}")
                    self._changed.wait(remaining)
            finally:
                self._waiters.remove(waiter)
        failed = [
            (name, version, state)
            for name, (version, state) in sorted(waiter.settled.items())
            if state.state != State.AVAILABLE
        ]
        if failed:
            parts = []
            for name, version, state in failed:
                error = (
                    f" due to error: {code_name(state.error.grpc_code)}: {state.error.message}"
                    if state.error is not None
                    else ""
                )
                parts.append(f"{{{{name: {name} version: {version}}}{error}}}, ")
            raise Unknown(f"{len(failed)} {noun} did not become available: {{{''.join(parts)}}}")

    def status(self, request: get_model_status_pb2.GetModelStatusRequest
               ) -> get_model_status_pb2.GetModelStatusResponse:
        """GetModelStatusImpl: every version the monitor has seen, ascending; labels ignored."""
        if not request.HasField("model_spec"):
            raise InvalidArgument("Missing ModelSpec")
        spec = request.model_spec
        check_name_length(spec.name)
        states = self.states(spec.name)
        if spec.HasField("version"):
            version = spec.version.value
            if version not in states:
                raise NotFound(f"Could not find version {version} of model {spec.name}")
            states = {version: states[version]}
        elif not states:
            raise NotFound(f"Could not find any versions of model {spec.name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        for version in sorted(states):
            state = states[version]
            entry = response.model_version_status.add(version=version, state=int(state.state))
            entry.status.SetInParent()  # always present, OK included (util::ConvertStatus)
            if state.error is not None:
                entry.status.error_code = state.error.grpc_code.value[0]
                entry.status.error_message = state.error.message
        return response
