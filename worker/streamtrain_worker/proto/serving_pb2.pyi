from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ServerReadyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerReadyResponse(_message.Message):
    __slots__ = ("ready",)
    READY_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    def __init__(self, ready: _Optional[bool] = ...) -> None: ...

class ModelInferRequest(_message.Message):
    __slots__ = ("model_name", "id", "rows", "columns_json")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_JSON_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    id: str
    rows: _containers.RepeatedScalarFieldContainer[str]
    columns_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_name: _Optional[str] = ..., id: _Optional[str] = ..., rows: _Optional[_Iterable[str]] = ..., columns_json: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelInferResponse(_message.Message):
    __slots__ = ("model_name", "model_version", "version_id", "id", "scores")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_version: str
    version_id: int
    id: str
    scores: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., version_id: _Optional[int] = ..., id: _Optional[str] = ..., scores: _Optional[_Iterable[float]] = ...) -> None: ...
