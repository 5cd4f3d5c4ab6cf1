"""Text-format ModelServerConfig parsing and TF Serving's config validation.

Every check here reproduces a check of ``ServerCore`` (model_servers/server_core.cc)
with its exact error text; the reload algorithm that calls them, in TF Serving's
order, lives in server_core.py.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from urllib.parse import urlsplit

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from tfscache.errors import InvalidArgument

ModelServerConfig = model_server_config_pb2.ModelServerConfig
ModelConfig = model_server_config_pb2.ModelConfig

TENSORFLOW_PLATFORM = "tensorflow"
SUPPORTED_PLATFORMS = frozenset({TENSORFLOW_PLATFORM})


class ConfigParseError(InvalidArgument):
    """A --model_config_file that is not a text-format ModelServerConfig."""


def parse_model_server_config(text: str) -> ModelServerConfig:
    """Parse text-format ModelServerConfig, failing with tensorflow_model_server's message."""
    config = ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigParseError(
            f"Error parsing text-format tensorflow.serving.ModelServerConfig: {exc}"
        ) from exc
    return config


def read_model_server_config(path: str | Path) -> ModelServerConfig:
    return parse_model_server_config(Path(path).read_text())


def single_model_config(name: str, base_path: str) -> ModelServerConfig:
    """The config --model_name/--model_base_path stand for (ms/server.cc BuildSingleModelConfig)."""
    config = ModelServerConfig()
    model = config.model_config_list.config.add()
    model.name = name
    model.base_path = base_path
    model.model_platform = TENSORFLOW_PLATFORM
    return config


def get_platform(model: ModelConfig) -> str:
    """A model's platform, honouring the deprecated model_type field (GetPlatform)."""
    if model.model_type != model_server_config_pb2.MODEL_TYPE_UNSPECIFIED:
        if model.model_platform:
            raise InvalidArgument(
                "Illegal setting both ModelServerConfig::model_type (deprecated) "
                "and ModelServerConfig::model_platform."
            )
        if model.model_type != model_server_config_pb2.TENSORFLOW:
            raise InvalidArgument(
                f"ModelServerConfig::model_type choice {model.model_type} not supported."
            )
        return TENSORFLOW_PLATFORM
    if not model.model_platform:
        raise InvalidArgument(
            "Illegal setting neither ModelServerConfig::model_type (deprecated) "
            "nor ModelServerConfig::model_platform."
        )
    return model.model_platform


def _is_relative(uri: str) -> bool:
    """TF's UriIsRelativePath: no scheme, no host and not an absolute path."""
    parts = urlsplit(uri)
    if parts.scheme and "://" in uri:
        return False
    return not posixpath.isabs(uri)


def validate_model_config_list(config_list: model_server_config_pb2.ModelConfigList) -> None:
    """ValidateModelConfigList: unique names, absolute base paths."""
    seen: set[str] = set()
    for model in config_list.config:
        if model.name in seen:
            raise InvalidArgument(
                f"Illegal to list model {model.name} multiple times in config list"
            )
        seen.add(model.name)
    for model in config_list.config:
        if _is_relative(model.base_path):
            raise InvalidArgument(
                f"Expected model {model.name} to have an absolute path or URI; "
                f"got base_path()={model.base_path}"
            )


def validate_no_platform_changes(
    old: model_server_config_pb2.ModelConfigList, new: model_server_config_pb2.ModelConfigList
) -> None:
    """ValidateNoModelsChangePlatforms (GetPlatform errors of both lists propagate)."""
    old_platforms = {model.name: get_platform(model) for model in old.config}
    for model in new.config:
        if model.name not in old_platforms:
            continue
        platform = get_platform(model)
        if platform != old_platforms[model.name]:
            raise InvalidArgument(
                f"Illegal to change a model's platform. For model {model.name} platform was "
                f"{old_platforms[model.name]} and new platform requested is {platform}"
            )


def check_platforms_supported(config_list: model_server_config_pb2.ModelConfigList) -> None:
    """CreateStoragePathRoutes: every model's platform must be registered."""
    for model in config_list.config:
        platform = get_platform(model)
        if platform not in SUPPORTED_PLATFORMS:
            raise InvalidArgument(f"Model {model.name} requests unsupported platform {platform}")


def parse_channel_arguments(text: str) -> list[tuple[str, str | int]]:
    """--grpc_channel_arguments 'k=v,k=v'; integer values become ints (ms/server.cc)."""
    arguments: list[tuple[str, str | int]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidArgument(f"Malformed --grpc_channel_arguments entry: {item!r}")
        try:
            arguments.append((key.strip(), int(value)))
        except ValueError:
            arguments.append((key.strip(), value.strip()))
    return arguments
