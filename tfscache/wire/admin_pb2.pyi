from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResidentModel(_message.Message):
    __slots__ = ("name", "version", "bytes", "measured", "leases", "last_use", "state", "pinned")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LAST_USE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    bytes: int
    measured: bool
    leases: int
    last_use: float
    state: str
    pinned: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., bytes: _Optional[int] = ..., measured: _Optional[bool] = ..., leases: _Optional[int] = ..., last_use: _Optional[float] = ..., state: _Optional[str] = ..., pinned: _Optional[bool] = ...) -> None: ...

class NodeModels(_message.Message):
    __slots__ = ("node", "healthy", "draining", "models", "queued")
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    node: str
    healthy: bool
    draining: bool
    models: _containers.RepeatedCompositeFieldContainer[ResidentModel]
    queued: int
    def __init__(self, node: _Optional[str] = ..., healthy: _Optional[bool] = ..., draining: _Optional[bool] = ..., models: _Optional[_Iterable[_Union[ResidentModel, _Mapping]]] = ..., queued: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("nodes", "draining")
    NODES_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeModels]
    draining: bool
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeModels, _Mapping]]] = ..., draining: _Optional[bool] = ...) -> None: ...

class ModelRequest(_message.Message):
    __slots__ = ("name", "version", "node", "timeout_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    node: str
    timeout_s: float
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., node: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class ModelResult(_message.Message):
    __slots__ = ("node", "models")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    node: str
    models: _containers.RepeatedCompositeFieldContainer[ResidentModel]
    def __init__(self, node: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ResidentModel, _Mapping]]] = ...) -> None: ...

class ModelResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ModelResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ModelResult, _Mapping]]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("node", "grace_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    node: str
    grace_s: float
    def __init__(self, node: _Optional[str] = ..., grace_s: _Optional[float] = ...) -> None: ...

class DrainProgress(_message.Message):
    __slots__ = ("phase", "models_left", "models_total", "leases", "done")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MODELS_LEFT_FIELD_NUMBER: _ClassVar[int]
    MODELS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    phase: str
    models_left: int
    models_total: int
    leases: int
    done: bool
    def __init__(self, phase: _Optional[str] = ..., models_left: _Optional[int] = ..., models_total: _Optional[int] = ..., leases: _Optional[int] = ..., done: _Optional[bool] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("registered", "message")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    registered: bool
    message: str
    def __init__(self, registered: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...
