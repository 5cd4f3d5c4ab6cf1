"""ServingCore: TF Serving's ServerCore and AspiredVersionsManager.

The pieces and the C++ they stand for:

* ``ServingCore.reload`` is ``ServerCore::ReloadConfig``: one lock for the whole call,
  validation, ``config_`` replaced before later failures, the label map rebuilt, then
  the source config swapped and a wait for *newly named* models only.
* The file-system source (``FileSystemStoragePathSource``: version directories, version
  policies, the poll thread) is source.py; it sends aspired versions to ``_aspire``.
* The manager thread is ``AspiredVersionsManager`` with ``AvailabilityPreservingPolicy``:
  one action per model per tick (100 ms or sooner when something changed), loads with
  retries, failed versions stay managed while aspired (sticky), unaspired ones unload.
* Versions publish START/LOADING/AVAILABLE/UNLOADING/END into a monitor that is never
  pruned (state_monitor.py); each reload waits on a fresh ``StateWaiter``. The states, the
  managed versions and the loading of one (retries, the load gate) are loader_harness.py's.
* ``servable()`` hands out reference-counted handles; an unload removes the version from
  the serving map, then waits for the last handle before unloading.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tensorflow_serving.apis import get_model_status_pb2, model_pb2
from tensorflow_serving.config import model_server_config_pb2

from tfscache.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    TfscacheError,
    Unavailable,
)
from tfscache.modelserver import config as node_config
from tfscache.modelserver.loader_harness import (
    Harness,
    ManagedVersion,
    ServableState,
    State,
    gated_load,
    load_with_retries,
    release_memory,
    rss_bytes,
    saved_model_loader,
)
from tfscache.modelserver.state_monitor import StateMonitor
from tfscache.modelserver.source import FileSystemSource
from tfscache.repository.local import check_name_length

log = logging.getLogger("tfscache.node.manager")

TICK_S = 0.1  # AspiredVersionsManager's manage-state period
ModelServerConfig = model_server_config_pb2.ModelServerConfig


@dataclass(frozen=True)
class ManagerOptions:
    """The ServerCore options that tensorflow_model_server's flags set."""

    file_system_poll_wait_seconds: float = 1.0
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60_000_000
    num_load_threads: int = 0
    num_unload_threads: int = 0
    num_initial_load_threads: int = 4 * (os.cpu_count() or 1)
    allow_version_labels_for_unavailable_models: bool = False
    load_gate_dir: str | None = None
    saved_model_tags: tuple[str, ...] = ("serve",)
    # --enable_model_warmup / --num_request_iterations_for_warmup: replays per record; None: no warm-up
    warmup_iterations: int | None = 1
    # ServerCore's servable_state_waiter_timeout: None = infinite, as in TF Serving.
    servable_state_waiter_timeout_s: float | None = None


def request_text(name: str, version: int | None) -> str:
    """ServableRequest::DebugString as in 'Servable not found for request: ...'."""
    return f"Latest({name})" if version is None else f"Specific({name}, {version})"


class ServingCore:
    """Owns every servable of a node and applies ModelServerConfigs as TF Serving does."""

    def __init__(self, options: ManagerOptions = ManagerOptions(),
                 loader: Callable[[str, int, str], object] | None = None) -> None:
        """``loader(name, version, path)`` defaults to servable.load_servable."""
        self.options = options
        self._loader = loader or saved_model_loader(
            options.saved_model_tags, options.warmup_iterations
        )
        self._config_mu = threading.Lock()  # config_mu_: serialises reloads
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._config = ModelServerConfig()
        self._labels: dict[str, dict[str, int]] | None = None
        self._monitor = StateMonitor()
        self._versions: dict[tuple[str, int], ManagedVersion] = {}
        self._by_name: dict[str, dict[int, ManagedVersion]] = {}  # the same entries, by model
        self._pending_aspired: dict[str, dict[int, str]] = {}
        self._busy: set[tuple[str, int]] = set()  # versions with an action under way
        self._stopped = threading.Event()
        # FileSystemStoragePathSource: not started until a first list config succeeded.
        self._source = FileSystemSource(self._changed, self._stopped, self._aspire)
        self._dirty = False
        self._initial_load = False
        self._load_pool = self._pool(options.num_load_threads, "load")
        self._unload_pool = self._pool(options.num_unload_threads, "unload")
        self._initial_pool = self._pool(options.num_initial_load_threads, "initial-load")
        self._manager = threading.Thread(target=self._manage, name="tfscache-manager", daemon=True)
        self._manager.start()

    @staticmethod
    def _pool(threads: int, name: str) -> concurrent.futures.ThreadPoolExecutor | None:
        if threads <= 0:
            return None
        return concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix=f"tfscache-{name}")

    # ------------------------------------------------------------------ reload

    def reload(self, new: ModelServerConfig) -> None:
        """ServerCore::ReloadConfig; blocks until newly named models settle."""
        with self._config_mu:
            current = self._config.WhichOneof("config")
            requested = new.WhichOneof("config")
            if not (current is None or (current == requested == "model_config_list")):
                raise FailedPrecondition(
                    "Cannot transition to requested config. It is only legal to transition "
                    "from one ModelConfigList to another."
                )
            if requested is None:
                log.info("Taking no action for empty config.")
                return
            if requested != "model_config_list":
                raise InvalidArgument("Invalid ServerModelConfig")
            node_config.validate_model_config_list(new.model_config_list)
            if current == "model_config_list":
                node_config.validate_no_platform_changes(
                    self._config.model_config_list, new.model_config_list)
            self._config = copy.deepcopy(new)  # replaced before the later checks can fail
            self._update_labels()
            log.info("Adding/updating models.")
            self._add_models()
            log.info("Finished reloading config")

    def _update_labels(self) -> None:
        """UpdateModelVersionLabelMap: each label must name an AVAILABLE version."""
        labels: dict[str, dict[str, int]] = {}
        with self._lock:
            for model in self._config.model_config_list.config:
                states = self._monitor.states(model.name)
                for label, version in sorted(model.version_labels.items()):  # TF: map order
                    allow = False
                    if self.options.allow_version_labels_for_unavailable_models:
                        existing = (self._labels or {}).get(model.name, {}).get(label)
                        allow = existing is None or existing == version
                    state = states.get(version)
                    if not allow and (state is None or state.state != State.AVAILABLE):
                        raise FailedPrecondition(
                            f"Request to assign label to version {version} of model {model.name}, "
                            "which is not currently available for inference"
                        )
                    labels.setdefault(model.name, {})[label] = version
            self._labels = labels

    def _add_models(self) -> None:
        """AddModelsViaModelConfigList."""
        config_list = self._config.model_config_list
        node_config.check_platforms_supported(config_list)
        models = {model.name: copy.deepcopy(model) for model in config_list.config}
        if not self._source.started:
            # First list config: start the source and wait for ALL models on the main
            # monitor (ConnectSourcesWithFastInitialLoad). On failure the source is not kept.
            waiter = self._monitor.watch(set(models), seed=True)
            with self._lock:
                self._initial_load = True
            self._source.start(models, self.options.file_system_poll_wait_seconds)
            try:
                self._monitor.wait(
                    waiter, "servable(s)", self.options.servable_state_waiter_timeout_s
                )
            except TfscacheError:
                self._source.stop()
                raise
            finally:
                with self._lock:
                    self._initial_load = False
            return
        waiter = self._monitor.watch(set(models) - self._source.names(), seed=False)
        self._source.update(models)  # UpdateConfig un-aspires deleted models at once
        self._monitor.wait(waiter, "model(s)", self.options.servable_state_waiter_timeout_s)

    # ------------------------------------------------------------------ manager

    def _aspire(self, name: str, versions: dict[int, str]) -> None:
        """SetAspiredVersions (lock held): applied at once unless it must wait for a teardown."""
        self._pending_aspired[name] = versions
        self._apply_aspired()
        self._flush()
        self._dirty = True

    def _apply_aspired(self) -> None:
        """ProcessAspiredVersionsRequest for each pending model (under the lock)."""
        for name, versions in list(self._pending_aspired.items()):
            managed = dict(self._by_name.get(name, {}))
            if any(version in managed and not managed[version].aspired for version in versions):
                continue  # re-aspiring a version still being torn down: try again later
            del self._pending_aspired[name]
            for version, entry in managed.items():
                if entry.aspired and version not in versions:
                    entry.aspired = False
                    entry.cancel_retry.set()
            for version, path in versions.items():
                if version not in managed:
                    entry = ManagedVersion(name, version, path)
                    self._versions[(name, version)] = entry
                    self._by_name.setdefault(name, {})[version] = entry
                    self._publish(name, version, ServableState(State.START))

    def _flush(self) -> None:
        """FlushServables: forget unaspired versions that are new, failed or unloaded."""
        for key, entry in list(self._versions.items()):
            if key in self._busy:
                continue
            if entry.harness is Harness.DISABLED or (
                    not entry.aspired and entry.harness in (Harness.NEW, Harness.ERROR)):
                del self._versions[key]
                versions = self._by_name[entry.name]
                del versions[entry.version]
                if not versions:
                    del self._by_name[entry.name]

    def _next_actions(self) -> list[tuple[str, ManagedVersion]]:
        """AvailabilityPreservingPolicy::GetNextAction, once per model."""
        by_model: dict[str, list[ManagedVersion]] = {}
        for entry in self._versions.values():
            by_model.setdefault(entry.name, []).append(entry)
        actions = []
        for entries in by_model.values():
            if any((e.name, e.version) in self._busy for e in entries):
                continue  # one action at a time per model
            has_aspired = any(e.aspired for e in entries)
            has_aspired_serving = any(e.aspired and e.harness is Harness.READY for e in entries)
            unaspired_serving = [e for e in entries if not e.aspired and e.harness is Harness.READY]
            if unaspired_serving and (
                not has_aspired or has_aspired_serving or len(unaspired_serving) > 1
            ):
                actions.append(("unload", min(unaspired_serving, key=lambda e: e.version)))
                continue
            new = [e for e in entries if e.aspired and e.harness is Harness.NEW]
            if new:
                actions.append(("load", max(new, key=lambda e: e.version)))
        return actions

    def _manage(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                if not self._dirty:
                    self._changed.wait(TICK_S)
                self._dirty = False
                self._apply_aspired()
                self._flush()
                actions = self._next_actions()
                for _, entry in actions:
                    self._busy.add((entry.name, entry.version))
                pools = {"load": self._initial_pool if self._initial_load else self._load_pool,
                         "unload": self._unload_pool}
            for kind, entry in actions:
                run = self._load if kind == "load" else self._unload
                pool = pools[kind]
                if pool is None:
                    run(entry)  # 0 threads: inline on the manager thread, as in TF Serving
                else:
                    pool.submit(run, entry)

    # ------------------------------------------------------------------ load / unload

    def _load(self, entry: ManagedVersion) -> None:
        key = (entry.name, entry.version)
        with self._lock:
            entry.harness = Harness.LOADING
            self._publish(entry.name, entry.version, ServableState(State.LOADING))
        started = time.monotonic()
        servable, error = load_with_retries(
            entry, self._load_once, self.options.max_num_load_retries + 1,
            self.options.load_retry_interval_micros / 1e6, self._stopped)
        # logged before AVAILABLE is published: whoever waits for it (start-up) comes after
        if error is None:
            log.info("loaded %s version %s in %.3f s; rss=%d",
                     entry.name, entry.version, time.monotonic() - started, rss_bytes())
        with self._lock:
            self._busy.discard(key)
            if error is None:
                entry.servable = servable
                entry.harness = Harness.READY
                self._publish(entry.name, entry.version, ServableState(State.AVAILABLE))
            else:
                entry.harness = Harness.ERROR
                self._publish(entry.name, entry.version, ServableState(State.END, error))

    def _load_once(self, entry: ManagedVersion):
        return gated_load(entry, self._loader, self.options.load_gate_dir, self._stopped)

    def _unload(self, entry: ManagedVersion) -> None:
        started = time.monotonic()
        with self._lock:
            entry.harness = Harness.UNLOADING
            self._publish(entry.name, entry.version, ServableState(State.UNLOADING))
            # Out of the serving map (harness no longer READY); wait for the last handle.
            while entry.refs:
                self._changed.wait()
            servable, entry.servable = entry.servable, None
        try:
            unload = getattr(servable, "unload", None)
            if unload is not None:
                unload()
        except Exception:
            log.exception("unloading %s version %s failed", entry.name, entry.version)
        del servable
        release_memory()
        with self._lock:
            self._busy.discard((entry.name, entry.version))
            entry.harness = Harness.DISABLED
            self._publish(entry.name, entry.version, ServableState(State.END))
        log.info("unloaded %s version %s in %.3f s; rss=%d",
                 entry.name, entry.version, time.monotonic() - started, rss_bytes())

    def _publish(self, name: str, version: int, state: ServableState) -> None:
        """Send a state event to the monitor and every waiting reload (lock held)."""
        self._monitor.publish(name, version, state)
        self._dirty = True
        self._changed.notify_all()

    # ------------------------------------------------------------------ requests

    def resolve(self, model_spec: model_pb2.ModelSpec) -> tuple[str, int | None]:
        """ServableRequestFromModelSpec: (name, version or None for Latest)."""
        if not model_spec.name:
            raise InvalidArgument("ModelSpec has no name specified.")
        check_name_length(model_spec.name)  # not NOT_FOUND echoing a 16 KB name
        choice = model_spec.WhichOneof("version_choice")
        if choice == "version":
            return model_spec.name, model_spec.version.value
        if choice == "version_label":
            label = model_spec.version_label
            with self._lock:
                if self._labels is None:
                    raise Unavailable(f"Model labels does not init yet.{label}")
                version = self._labels.get(model_spec.name, {}).get(label)
            if version is None:
                raise InvalidArgument(f"Unrecognized servable version label: {label}")
            return model_spec.name, version
        return model_spec.name, None

    @contextlib.contextmanager
    def servable(self, model_spec: model_pb2.ModelSpec) -> Iterator[object]:
        """A handle on the servable for a ModelSpec; unloads wait until it is released."""
        name, version = self.resolve(model_spec)
        with self._lock:
            entry = self._serving_entry(name, version)
            if entry is None:
                raise NotFound(f"Servable not found for request: {request_text(name, version)}")
            entry.refs += 1
        try:
            yield entry.servable
        finally:
            with self._lock:
                entry.refs -= 1
                if not entry.refs:
                    self._changed.notify_all()

    def _serving_entry(self, name: str, version: int | None) -> ManagedVersion | None:
        versions = self._by_name.get(name, {})
        if version is not None:
            entry = versions.get(version)
            return entry if entry is not None and entry.harness is Harness.READY else None
        ready = [e for e in versions.values() if e.harness is Harness.READY]
        return max(ready, key=lambda e: e.version, default=None)

    def status(self, request: get_model_status_pb2.GetModelStatusRequest
               ) -> get_model_status_pb2.GetModelStatusResponse:
        """GetModelStatusImpl (state_monitor.py)."""
        return self._monitor.status(request)

    def states(self, name: str) -> dict[int, ServableState]:
        """The monitor's states of a model's versions (for tests and the REST status)."""
        return self._monitor.states(name)

    @property
    def config(self) -> ModelServerConfig:
        with self._lock:
            return copy.deepcopy(self._config)

    def stop(self) -> None:
        """Stop polling and managing; loaded servables are left to process exit."""
        self._stopped.set()
        with self._lock:
            self._source.cancel_polls()
            self._changed.notify_all()
        for pool in (self._load_pool, self._unload_pool, self._initial_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
