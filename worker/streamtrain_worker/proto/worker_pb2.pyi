from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class RunPassRequest(_message.Message):
    __slots__ = ("day", "pass_index", "files", "generation", "train", "next_files")
    DAY_FIELD_NUMBER: _ClassVar[int]
    PASS_INDEX_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TRAIN_FIELD_NUMBER: _ClassVar[int]
    NEXT_FILES_FIELD_NUMBER: _ClassVar[int]
    day: str
    pass_index: int
    files: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    train: bool
    next_files: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, day: _Optional[str] = ..., pass_index: _Optional[int] = ..., files: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ..., train: _Optional[bool] = ..., next_files: _Optional[_Iterable[str]] = ...) -> None: ...

class PassResult(_message.Message):
    __slots__ = ("day", "pass_index", "generation", "examples", "bad_lines", "loss_sum", "label_sum", "pred_sum", "abs_error_sum", "sq_error_sum", "pos_buckets", "neg_buckets", "num_buckets", "seconds", "train_seconds", "files_read", "files_read_ahead")
    DAY_FIELD_NUMBER: _ClassVar[int]
    PASS_INDEX_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    BAD_LINES_FIELD_NUMBER: _ClassVar[int]
    LOSS_SUM_FIELD_NUMBER: _ClassVar[int]
    LABEL_SUM_FIELD_NUMBER: _ClassVar[int]
    PRED_SUM_FIELD_NUMBER: _ClassVar[int]
    ABS_ERROR_SUM_FIELD_NUMBER: _ClassVar[int]
    SQ_ERROR_SUM_FIELD_NUMBER: _ClassVar[int]
    POS_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    NEG_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    NUM_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FILES_READ_FIELD_NUMBER: _ClassVar[int]
    FILES_READ_AHEAD_FIELD_NUMBER: _ClassVar[int]
    day: str
    pass_index: int
    generation: int
    examples: int
    bad_lines: int
    loss_sum: float
    label_sum: float
    pred_sum: float
    abs_error_sum: float
    sq_error_sum: float
    pos_buckets: bytes
    neg_buckets: bytes
    num_buckets: int
    seconds: float
    train_seconds: float
    files_read: int
    files_read_ahead: int
    def __init__(self, day: _Optional[str] = ..., pass_index: _Optional[int] = ..., generation: _Optional[int] = ..., examples: _Optional[int] = ..., bad_lines: _Optional[int] = ..., loss_sum: _Optional[float] = ..., label_sum: _Optional[float] = ..., pred_sum: _Optional[float] = ..., abs_error_sum: _Optional[float] = ..., sq_error_sum: _Optional[float] = ..., pos_buckets: _Optional[bytes] = ..., neg_buckets: _Optional[bytes] = ..., num_buckets: _Optional[int] = ..., seconds: _Optional[float] = ..., train_seconds: _Optional[float] = ..., files_read: _Optional[int] = ..., files_read_ahead: _Optional[int] = ...) -> None: ...

class ExportDenseRequest(_message.Message):
    __slots__ = ("uri", "snapshot_id")
    URI_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    uri: str
    snapshot_id: str
    def __init__(self, uri: _Optional[str] = ..., snapshot_id: _Optional[str] = ...) -> None: ...

class ExportDenseResponse(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, files: _Optional[_Iterable[str]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
