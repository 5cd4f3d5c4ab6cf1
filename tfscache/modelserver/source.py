"""TF Serving's FileSystemStoragePathSource: which versions of each model to serve.

* ``aspired_versions`` lists a model's base path and applies its model_version_policy
  (latest{N}, all, specific); numeric directory names are versions.
* ``FileSystemSource`` is the poll thread: every --file_system_poll_wait_seconds it
  lists each base path and sends the aspired versions of every model to the manager;
  one missing base path aborts the whole poll (the reload hang of docs/upstream/tfserving.md,
  "Requested error cases"). It shares the manager's lock, so a poll applies all models or
  none.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from tensorflow_serving.config import model_server_config_pb2

from tfscache.errors import InvalidArgument

# The manager's logger name, kept from before this code left server_core.py, so the node's
# log lines read as they did (a logger per module, "tfscache.<module>", loses to unchanged
# output).
log = logging.getLogger("tfscache.node.manager")

ModelConfig = model_server_config_pb2.ModelConfig


class FileSystemSource:
    """The storage-path source of a ServingCore; its state is guarded by the core's lock."""

    def __init__(self, changed: threading.Condition, stopped: threading.Event,
                 aspire: Callable[[str, dict[int, str]], None]) -> None:
        """``changed`` is the core's condition (its lock guards this source too);
        ``aspire(name, versions)`` is SetAspiredVersions, called with that lock held."""
        self._changed = changed
        self._stopped = stopped
        self._aspire = aspire
        self._models: dict[str, ModelConfig] | None = None  # None until started
        self._generation = 0
        self._poller: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """Whether a first list config started this source (and it was kept)."""
        return self._models is not None

    def names(self) -> set[str]:
        """The models this source polls."""
        return set(self._models or {})

    def start(self, models: dict[str, ModelConfig], period: float) -> None:
        """FileSystemStoragePathSource::Create: first poll now, then every period (0 = once)."""
        with self._changed:
            self._models = models
            self._generation += 1
            generation = self._generation
        if period < 0:
            return
        self._poller = threading.Thread(target=self._poll_loop, args=(generation, period),
                                        name="tfscache-fs-poll", daemon=True)
        self._poller.start()

    def update(self, models: dict[str, ModelConfig]) -> None:
        """UpdateConfig: poll the new models; deleted models are un-aspired at once."""
        with self._changed:
            removed = set(self._models) - set(models)
            self._models = models
            for name in removed:
                self._aspire(name, {})
            self._changed.notify_all()

    def stop(self) -> None:
        """Forget the models and end the poll thread (a failed first load keeps no source)."""
        with self._changed:
            self._models = None
            self._generation += 1

    def cancel_polls(self) -> None:
        """End the poll thread; a poll under way applies nothing (lock held)."""
        self._generation += 1

    def _poll_loop(self, generation: int, period: float) -> None:
        while not self._stopped.is_set():
            with self._changed:
                if generation != self._generation:
                    return
                models = dict(self._models or {})
            self._poll_once(models, generation)
            if period == 0 or self._stopped.wait(period):
                return

    def _poll_once(self, models: dict[str, ModelConfig], generation: int) -> None:
        aspired: dict[str, dict[int, str]] = {}
        for name, model in models.items():
            try:
                aspired[name] = aspired_versions(model)
            except InvalidArgument as exc:  # the first error aborts the poll for all models
                log.error("FileSystemStoragePathSource encountered a filesystem access error: %s",
                          exc.message)
                return
        with self._changed:
            if generation != self._generation:
                return
            for name, versions in aspired.items():
                if name in (self._models or {}):
                    self._aspire(name, versions)
            self._changed.notify_all()


# ---------------------------------------------------------------------- version policy

def _version_number(child: str) -> int | None:
    """absl::SimpleAtoi on a directory name: '00000123' -> 123; others are ignored."""
    text = child.strip()
    body = text[1:] if text[:1] in "+-" else text
    if not body.isdigit() or not body.isascii():
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def aspired_versions(model: model_server_config_pb2.ModelConfig) -> dict[int, str]:
    """The versions a model's model_version_policy aspires to, {version: path}."""
    base = model.base_path
    try:
        children = os.listdir(base)
    except OSError as exc:
        raise InvalidArgument(
            f"Could not find base path {base} for servable {model.name} with error {exc.strerror}"
        ) from exc
    found: dict[int, str] = {}
    for child in children:
        version = _version_number(child)
        if version is not None:
            found[version] = os.path.join(base, child)
    policy = model.model_version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        chosen = found
    elif choice == "specific":
        wanted = list(policy.specific.versions)
        if not wanted:
            log.warning("Version policy specific for servable %s has no versions", model.name)
        missing = [v for v in wanted if v not in found]
        if missing:
            log.warning("Version(s) %s of servable %s not found under base path %s",
                        missing, model.name, base)
        chosen = {v: found[v] for v in wanted if v in found}
    else:
        count = max(policy.latest.num_versions if choice == "latest" else 1, 1)
        chosen = {v: found[v] for v in sorted(found, reverse=True)[:count]}
    if not found:
        log.warning("No versions of servable %s found under base path %s", model.name, base)
    return chosen
