from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOAD_ONE_SHOT: _ClassVar[LoadPhase]
    LOAD_PREPARE: _ClassVar[LoadPhase]
    LOAD_COMMIT: _ClassVar[LoadPhase]
    LOAD_ABORT: _ClassVar[LoadPhase]
LOAD_ONE_SHOT: LoadPhase
LOAD_PREPARE: LoadPhase
LOAD_COMMIT: LoadPhase
LOAD_ABORT: LoadPhase

class PullSparseRequest(_message.Message):
    __slots__ = ("table", "keys")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    table: str
    keys: bytes
    def __init__(self, table: _Optional[str] = ..., keys: _Optional[bytes] = ...) -> None: ...

class PullSparseResponse(_message.Message):
    __slots__ = ("values", "dim")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    values: bytes
    dim: int
    def __init__(self, values: _Optional[bytes] = ..., dim: _Optional[int] = ...) -> None: ...

class PushSparseRequest(_message.Message):
    __slots__ = ("table", "keys", "grads", "dim", "shows", "clicks", "slots", "id", "dense")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    SHOWS_FIELD_NUMBER: _ClassVar[int]
    CLICKS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    table: str
    keys: bytes
    grads: bytes
    dim: int
    shows: bytes
    clicks: bytes
    slots: bytes
    id: RequestId
    dense: _containers.RepeatedCompositeFieldContainer[DenseGrads]
    def __init__(self, table: _Optional[str] = ..., keys: _Optional[bytes] = ..., grads: _Optional[bytes] = ..., dim: _Optional[int] = ..., shows: _Optional[bytes] = ..., clicks: _Optional[bytes] = ..., slots: _Optional[bytes] = ..., id: _Optional[_Union[RequestId, _Mapping]] = ..., dense: _Optional[_Iterable[_Union[DenseGrads, _Mapping]]] = ...) -> None: ...

class DenseGrads(_message.Message):
    __slots__ = ("name", "grads")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    name: str
    grads: bytes
    def __init__(self, name: _Optional[str] = ..., grads: _Optional[bytes] = ...) -> None: ...

class RequestId(_message.Message):
    __slots__ = ("client_id", "seq", "acked_below")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACKED_BELOW_FIELD_NUMBER: _ClassVar[int]
    client_id: bytes
    seq: int
    acked_below: int
    def __init__(self, client_id: _Optional[bytes] = ..., seq: _Optional[int] = ..., acked_below: _Optional[int] = ...) -> None: ...

class PushSparseResponse(_message.Message):
    __slots__ = ("keys_updated", "duplicate")
    KEYS_UPDATED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    keys_updated: int
    duplicate: bool
    def __init__(self, keys_updated: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class InitDenseRequest(_message.Message):
    __slots__ = ("name", "values", "summary")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: bytes
    summary: SummaryRule
    def __init__(self, name: _Optional[str] = ..., values: _Optional[bytes] = ..., summary: _Optional[_Union[SummaryRule, _Mapping]] = ...) -> None: ...

class SummaryRule(_message.Message):
    __slots__ = ("decay",)
    DECAY_FIELD_NUMBER: _ClassVar[int]
    decay: float
    def __init__(self, decay: _Optional[float] = ...) -> None: ...

class PullDenseRequest(_message.Message):
    __slots__ = ("name", "snapshot_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    snapshot_id: str
    def __init__(self, name: _Optional[str] = ..., snapshot_id: _Optional[str] = ...) -> None: ...

class DenseValues(_message.Message):
    __slots__ = ("name", "values", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: bytes
    version: int
    def __init__(self, name: _Optional[str] = ..., values: _Optional[bytes] = ..., version: _Optional[int] = ...) -> None: ...

class PushDenseRequest(_message.Message):
    __slots__ = ("name", "grads", "id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    grads: bytes
    id: RequestId
    def __init__(self, name: _Optional[str] = ..., grads: _Optional[bytes] = ..., id: _Optional[_Union[RequestId, _Mapping]] = ...) -> None: ...

class PushDenseResponse(_message.Message):
    __slots__ = ("version", "duplicate")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    version: int
    duplicate: bool
    def __init__(self, version: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class SaveRequest(_message.Message):
    __slots__ = ("uri", "mode", "table", "stage", "save_id", "snapshot", "from_snapshot")
    URI_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SAVE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    FROM_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    uri: str
    mode: int
    table: str
    stage: bool
    save_id: str
    snapshot: bool
    from_snapshot: str
    def __init__(self, uri: _Optional[str] = ..., mode: _Optional[int] = ..., table: _Optional[str] = ..., stage: _Optional[bool] = ..., save_id: _Optional[str] = ..., snapshot: _Optional[bool] = ..., from_snapshot: _Optional[str] = ...) -> None: ...

class FileEntry(_message.Message):
    __slots__ = ("path", "size", "sha256", "rows")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    sha256: str
    rows: int
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ..., rows: _Optional[int] = ...) -> None: ...

class SaveResponse(_message.Message):
    __slots__ = ("files", "keys_saved", "tombstones", "seconds", "save_id")
    FILES_FIELD_NUMBER: _ClassVar[int]
    KEYS_SAVED_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAVE_ID_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileEntry]
    keys_saved: int
    tombstones: int
    seconds: float
    save_id: str
    def __init__(self, files: _Optional[_Iterable[_Union[FileEntry, _Mapping]]] = ..., keys_saved: _Optional[int] = ..., tombstones: _Optional[int] = ..., seconds: _Optional[float] = ..., save_id: _Optional[str] = ...) -> None: ...

class FinishSaveRequest(_message.Message):
    __slots__ = ("uri", "save_id", "commit")
    URI_FIELD_NUMBER: _ClassVar[int]
    SAVE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    uri: str
    save_id: str
    commit: bool
    def __init__(self, uri: _Optional[str] = ..., save_id: _Optional[str] = ..., commit: _Optional[bool] = ...) -> None: ...

class FinishSaveResponse(_message.Message):
    __slots__ = ("applied",)
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    def __init__(self, applied: _Optional[bool] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("uri", "phase", "load_id", "discard_live")
    URI_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LOAD_ID_FIELD_NUMBER: _ClassVar[int]
    DISCARD_LIVE_FIELD_NUMBER: _ClassVar[int]
    uri: str
    phase: LoadPhase
    load_id: str
    discard_live: bool
    def __init__(self, uri: _Optional[str] = ..., phase: _Optional[_Union[LoadPhase, str]] = ..., load_id: _Optional[str] = ..., discard_live: _Optional[bool] = ...) -> None: ...

class LoadResponse(_message.Message):
    __slots__ = ("keys_loaded", "seconds")
    KEYS_LOADED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    keys_loaded: int
    seconds: float
    def __init__(self, keys_loaded: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class ShrinkRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class ShrinkResponse(_message.Message):
    __slots__ = ("keys_before", "deleted", "keys_after")
    KEYS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    KEYS_AFTER_FIELD_NUMBER: _ClassVar[int]
    keys_before: int
    deleted: int
    keys_after: int
    def __init__(self, keys_before: _Optional[int] = ..., deleted: _Optional[int] = ..., keys_after: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TableStats(_message.Message):
    __slots__ = ("name", "keys", "expanded_keys", "memory_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    EXPANDED_KEYS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    keys: int
    expanded_keys: int
    memory_bytes: int
    def __init__(self, name: _Optional[str] = ..., keys: _Optional[int] = ..., expanded_keys: _Optional[int] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("tables", "shard_index", "num_shards", "dense_names")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    DENSE_NAMES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableStats]
    shard_index: int
    num_shards: int
    dense_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableStats, _Mapping]]] = ..., shard_index: _Optional[int] = ..., num_shards: _Optional[int] = ..., dense_names: _Optional[_Iterable[str]] = ...) -> None: ...
