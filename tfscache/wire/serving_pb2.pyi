from google.protobuf import wrappers_pb2 as _wrappers_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelSpec(_message.Message):
    __slots__ = ("name", "version", "version_label", "signature_name")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_LABEL_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: _wrappers_pb2.Int64Value
    version_label: str
    signature_name: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[_Union[_wrappers_pb2.Int64Value, _Mapping]] = ..., version_label: _Optional[str] = ..., signature_name: _Optional[str] = ...) -> None: ...

class SpecHead(_message.Message):
    __slots__ = ("model_spec",)
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    model_spec: ModelSpec
    def __init__(self, model_spec: _Optional[_Union[ModelSpec, _Mapping]] = ...) -> None: ...

class InferenceTask(_message.Message):
    __slots__ = ("model_spec", "method_name")
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    METHOD_NAME_FIELD_NUMBER: _ClassVar[int]
    model_spec: ModelSpec
    method_name: str
    def __init__(self, model_spec: _Optional[_Union[ModelSpec, _Mapping]] = ..., method_name: _Optional[str] = ...) -> None: ...

class MultiInferenceHead(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[InferenceTask]
    def __init__(self, tasks: _Optional[_Iterable[_Union[InferenceTask, _Mapping]]] = ...) -> None: ...

class StatusProto(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: int
    error_message: str
    def __init__(self, error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class ModelVersionStatus(_message.Message):
    __slots__ = ("version", "state", "status")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[ModelVersionStatus.State]
        START: _ClassVar[ModelVersionStatus.State]
        LOADING: _ClassVar[ModelVersionStatus.State]
        AVAILABLE: _ClassVar[ModelVersionStatus.State]
        UNLOADING: _ClassVar[ModelVersionStatus.State]
        END: _ClassVar[ModelVersionStatus.State]
    UNKNOWN: ModelVersionStatus.State
    START: ModelVersionStatus.State
    LOADING: ModelVersionStatus.State
    AVAILABLE: ModelVersionStatus.State
    UNLOADING: ModelVersionStatus.State
    END: ModelVersionStatus.State
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: ModelVersionStatus.State
    status: StatusProto
    def __init__(self, version: _Optional[int] = ..., state: _Optional[_Union[ModelVersionStatus.State, str]] = ..., status: _Optional[_Union[StatusProto, _Mapping]] = ...) -> None: ...

class GetModelStatusRequest(_message.Message):
    __slots__ = ("model_spec",)
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    model_spec: ModelSpec
    def __init__(self, model_spec: _Optional[_Union[ModelSpec, _Mapping]] = ...) -> None: ...

class GetModelStatusResponse(_message.Message):
    __slots__ = ("model_version_status",)
    MODEL_VERSION_STATUS_FIELD_NUMBER: _ClassVar[int]
    model_version_status: _containers.RepeatedCompositeFieldContainer[ModelVersionStatus]
    def __init__(self, model_version_status: _Optional[_Iterable[_Union[ModelVersionStatus, _Mapping]]] = ...) -> None: ...

class ServableVersionPolicy(_message.Message):
    __slots__ = ("latest", "all", "specific")
    class Latest(_message.Message):
        __slots__ = ("num_versions",)
        NUM_VERSIONS_FIELD_NUMBER: _ClassVar[int]
        num_versions: int
        def __init__(self, num_versions: _Optional[int] = ...) -> None: ...
    class All(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Specific(_message.Message):
        __slots__ = ("versions",)
        VERSIONS_FIELD_NUMBER: _ClassVar[int]
        versions: _containers.RepeatedScalarFieldContainer[int]
        def __init__(self, versions: _Optional[_Iterable[int]] = ...) -> None: ...
    LATEST_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    SPECIFIC_FIELD_NUMBER: _ClassVar[int]
    latest: ServableVersionPolicy.Latest
    all: ServableVersionPolicy.All
    specific: ServableVersionPolicy.Specific
    def __init__(self, latest: _Optional[_Union[ServableVersionPolicy.Latest, _Mapping]] = ..., all: _Optional[_Union[ServableVersionPolicy.All, _Mapping]] = ..., specific: _Optional[_Union[ServableVersionPolicy.Specific, _Mapping]] = ...) -> None: ...

class ModelConfig(_message.Message):
    __slots__ = ("name", "base_path", "model_type", "model_platform", "model_version_policy", "version_labels")
    class VersionLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_PATH_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PLATFORM_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_LABELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    base_path: str
    model_type: int
    model_platform: str
    model_version_policy: ServableVersionPolicy
    version_labels: _containers.ScalarMap[str, int]
    def __init__(self, name: _Optional[str] = ..., base_path: _Optional[str] = ..., model_type: _Optional[int] = ..., model_platform: _Optional[str] = ..., model_version_policy: _Optional[_Union[ServableVersionPolicy, _Mapping]] = ..., version_labels: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ModelConfigList(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: _containers.RepeatedCompositeFieldContainer[ModelConfig]
    def __init__(self, config: _Optional[_Iterable[_Union[ModelConfig, _Mapping]]] = ...) -> None: ...

class ModelServerConfig(_message.Message):
    __slots__ = ("model_config_list",)
    MODEL_CONFIG_LIST_FIELD_NUMBER: _ClassVar[int]
    model_config_list: ModelConfigList
    def __init__(self, model_config_list: _Optional[_Union[ModelConfigList, _Mapping]] = ...) -> None: ...

class ReloadConfigRequest(_message.Message):
    __slots__ = ("config", "metric_names")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    METRIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    config: ModelServerConfig
    metric_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, config: _Optional[_Union[ModelServerConfig, _Mapping]] = ..., metric_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ReloadConfigResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: StatusProto
    def __init__(self, status: _Optional[_Union[StatusProto, _Mapping]] = ...) -> None: ...
