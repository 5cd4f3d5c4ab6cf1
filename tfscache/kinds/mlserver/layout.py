"""MLServer's own (flat) repository layout: ``ROOT/NAME/model-settings.json`` beside the artefact.

A model directory holding ``model-settings.json`` itself, with no version folder, is one model
of one version (``tfscache.repository.local.FLAT_VERSION`` inside the cache); MLServer names
that version by ``parameters.version`` (a string such as ``v1``, or none), and so do requests
(``/v2/models/NAME/versions/v1/infer``, gRPC ``model_version = "v1"``). The folder's name is the
model's name: a ``name`` in the file must be the same (MLServer would serve it under that other
name, which tfscache would not route to). docs/mlserver.md, "Repository layout".
"""

from __future__ import annotations

import json
from pathlib import Path

from tfscache import errors

SETTINGS_FILE = "model-settings.json"


class MLServerLayout:
    """``model-settings.json`` as MLServer reads it (mlserver/repository/load.py): flat models."""

    settings_file = SETTINGS_FILE

    def version_name(self, settings: Path, name: str) -> str:
        try:
            data = json.loads(settings.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise errors.FailedPrecondition(
                f"Malformed model settings file {settings}: {exc}") from None
        if not isinstance(data, dict):
            raise errors.FailedPrecondition(
                f"Malformed model settings file {settings}: expected a JSON object")
        named = data.get("name")
        if named not in (None, "", name):
            raise errors.FailedPrecondition(
                f"model settings file {settings} names model {named!r}, but its folder is "
                f"{name!r}: "
                f"tfscache serves a flat model under its folder's name (drop \"name\" or make "
                f"them the same)")
        parameters = data.get("parameters") or {}
        version = parameters.get("version") if isinstance(parameters, dict) else None
        if version is not None and not isinstance(version, str):
            raise errors.FailedPrecondition(
                f"Malformed model settings file {settings}: parameters.version must be a string, "
                f"got {json.dumps(version)}")
        return version or ""

    def unknown_version(self, name: str, version: str) -> errors.TfscacheError:
        """MLServer's own NOT_FOUND text (mlserver.errors.ModelNotFound) for a version name."""
        return errors.NotFound(f"Model {name} with version {version} not found")


LAYOUT = MLServerLayout()
