"""The node's text-format server configs: --monitoring_config_file and --ssl_config_file.

tensorflow-serving-api's wheel ships neither ``config/monitoring_config.proto`` nor
``config/ssl_config.proto``, so their two and one messages are declared here, with
TF Serving's full names and field numbers, in a descriptor pool of their own (the
default pool stays free for the wheel, should a later release add them).

Read as ``ParseProtoTextFile`` reads them (util/proto_util.h): a missing file is
NOT_FOUND "<path>; No such file or directory"; a file that does not parse logs
protobuf's "Error parsing text-format tensorflow.serving.X: L:C : reason" and is
INVALID_ARGUMENT "Invalid protobuf file: '<path>'" (``ConfigFileError.detail`` holds
the parse error). ``server_credentials`` builds the gRPC server credentials as
``BuildServerCredentials`` in ms/server.cc does.
"""

from __future__ import annotations

import concurrent.futures
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from tfscache.errors import InvalidArgument, NotFound

_FIELD = descriptor_pb2.FieldDescriptorProto


def _messages() -> dict[str, type]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/config/server_configs.proto", package="tensorflow.serving",
        syntax="proto3")
    fields = {
        "PrometheusConfig": [
            ("enable", 1, _FIELD.TYPE_BOOL, ""),
            ("path", 2, _FIELD.TYPE_STRING, ""),
        ],
        "MonitoringConfig": [
            ("prometheus_config", 1, _FIELD.TYPE_MESSAGE, ".tensorflow.serving.PrometheusConfig")
        ],
        "SSLConfig": [
            ("server_key", 1, _FIELD.TYPE_STRING, ""),
            ("server_cert", 2, _FIELD.TYPE_STRING, ""),
            ("custom_ca", 3, _FIELD.TYPE_STRING, ""),
            ("client_verify", 4, _FIELD.TYPE_BOOL, ""),
        ],
    }
    for name, declared in fields.items():
        message = proto.message_type.add(name=name)
        for field_name, number, kind, type_name in declared:
            entry = message.field.add(name=field_name, number=number, type=kind,
                                      label=_FIELD.LABEL_OPTIONAL, json_name=field_name)
            if type_name:
                entry.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"tensorflow.serving.{name}")
        )
        for name in fields
    }


_MESSAGES = _messages()
MonitoringConfig = _MESSAGES["MonitoringConfig"]
SSLConfig = _MESSAGES["SSLConfig"]


class ConfigFileError(InvalidArgument):
    """A server config file that does not parse; ``detail``: protobuf's parse error."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def read_config_file(path: str, message_type: type):
    """ParseProtoTextFile: the parsed message, or TF Serving's error."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError as exc:
        raise NotFound(f"{path}; No such file or directory") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"Invalid protobuf file: '{path}' ({exc})") from exc
    message = message_type()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ConfigFileError(
            f"Invalid protobuf file: '{path}'",
            f"Error parsing text-format {message_type.DESCRIPTOR.full_name}: {exc}") from exc
    return message


def prometheus_path(config) -> str | None:
    """The path the REST port serves metrics on, None when Prometheus is off."""
    from tfscache.modelserver.serving_metrics import DEFAULT_PATH

    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    return prometheus.path or DEFAULT_PATH


def server_credentials(config) -> grpc.ServerCredentials:
    """SslServerCredentials from an SSLConfig: key and certificate, custom_ca as the client
    roots, client_verify requiring and verifying a client certificate."""
    if config.client_verify and not config.custom_ca:
        # gRPC C++ would fall back to its default roots; Python's gRPC has none to offer.
        raise InvalidArgument("SSLConfig.client_verify needs SSLConfig.custom_ca: the CA "
                              "that signs the client certificates")
    if not config.server_key or not config.server_cert:
        raise InvalidArgument("SSLConfig needs both server_key and server_cert (PEM text)")
    credentials = grpc.ssl_server_credentials(
        [(config.server_key.encode(), config.server_cert.encode())],
        root_certificates=config.custom_ca.encode() or None,
        require_client_auth=config.client_verify)
    _check_credentials(credentials)
    return credentials


def _check_credentials(credentials: grpc.ServerCredentials) -> None:
    """gRPC checks the PEM text only when a port is added: add one now, on a UNIX socket in
    a private directory of a server never started, so bad PEM fails before models load."""
    with tempfile.TemporaryDirectory(prefix="tfscache-ssl-") as directory:
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        server = grpc.server(executor)
        try:
            server.add_secure_port(f"unix:{directory}/probe.sock", credentials)
        except RuntimeError as exc:
            raise InvalidArgument(
                "Failed to BuildAndStart gRPC server: gRPC does not accept the SSLConfig's "
                "server_key, server_cert or custom_ca (PEM text expected; its log above says "
                "which)") from exc
        finally:
            server.stop(None)
            executor.shutdown()


@dataclass(frozen=True)
class ServerConfigs:
    """What --ssl_config_file and --monitoring_config_file ask for, checked before start."""

    credentials: grpc.ServerCredentials | None = None  # None: insecure gRPC
    metrics_path: str | None = None                    # the Prometheus page; None: off


def load_server_configs(ssl_config_file: str, monitoring_config_file: str) -> ServerConfigs:
    """Both files read and checked ("" : not given); TfscacheError on the first problem."""
    credentials = metrics_path = None
    if ssl_config_file:
        credentials = server_credentials(read_config_file(ssl_config_file, SSLConfig))
    if monitoring_config_file:
        metrics_path = prometheus_path(read_config_file(monitoring_config_file, MonitoringConfig))
    return ServerConfigs(credentials, metrics_path)
