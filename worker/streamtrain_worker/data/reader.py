"""Streaming a worker's files of one pass as fixed-size batches, parsed ahead in the background.

``PassReader`` reads its files in order (gzip detected by magic bytes or ``.gz``), cuts them
into blocks at line boundaries, parses each block with the format's numba kernel in a
background thread (kernels release the GIL, so parsing overlaps training), and hands the
consumer batches of exactly ``batch_size`` examples (the last one may be smaller). A bounded
queue of parsed blocks caps memory and lets the reader run at most ``prefetch_blocks`` ahead.

Bad-line policy: a bad line (wrong column count, unparsable number or label, malformed token)
is counted per file and skipped. The limit is **per file**: a file whose fraction ``bad /
lines`` exceeds ``maxBadLineFraction`` fails the pass — iteration raises ``BadDataError``
naming the file, its counts and its first bad line numbers (with reasons) — and **none of
that file's examples is handed out**: the producer holds a file's parsed blocks until the
file's fraction is known. A per-pass limit would let a small file of garbage through beside
a large healthy one, and checking only after the pass had been read would have trained (and
pushed) the garbage first. Holding is bounded: past ``hold_blocks`` blocks of a file (256
MiB of input by default) the rest of the file is parsed ahead only to count its bad lines,
then the file is read again from the first block not held — parse work doubles only for
files larger than that. A file of garbage sorted first in a share therefore pushes nothing;
files before it were trained (the pass fails anyway, and a rerun reloads the checkpoint).
"""

from __future__ import annotations

import gzip
import queue
import threading
import zlib
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import IO, Any, cast

import fsspec
import numpy as np
from fsspec.spec import AbstractFileSystem

from streamtrain_worker.data.batch import Batch, concat_batches, slice_batch
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.errors import BadDataError, CorruptFileError
from streamtrain_worker.data.formats import REASONS, Format, ParsedBlock, make_format
from streamtrain_worker.data.formats.kernel import BlockParser

DEFAULT_BLOCK_BYTES = 4 << 20
DEFAULT_PREFETCH_BLOCKS = 4
#: Parsed blocks of one file held until its bad-line fraction is known (x 4 MiB of input).
DEFAULT_HOLD_BLOCKS = 64
#: Bad line numbers remembered per file (for the error message).
FIRST_BAD_LINES = 10
_GZIP_MAGIC = b"\x1f\x8b"
_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class ReadStats:
    """Progress of the background reader (a snapshot)."""

    files: int = 0  # files completely read
    lines: int = 0  # data lines (good + bad, blank lines excluded)
    bad_lines: int = 0
    examples: int = 0
    bytes_read: int = 0  # uncompressed bytes


@dataclass
class FileReport:
    """Bad lines of one file: counts and the first few line numbers with reasons."""

    path: str
    lines: int = 0
    bad_lines: int = 0
    first_bad: list[tuple[int, str]] = field(default_factory=list)


class _End:
    """Queue sentinel: the producer finished normally."""


def open_data_file(path: str, fs: AbstractFileSystem | None = None) -> tuple[ExitStack, IO[bytes]]:
    """Open ``path`` for reading, decompressing gzip transparently (by magic or ``.gz``)."""
    stack = ExitStack()
    raw: IO[bytes] = stack.enter_context(
        fs.open(path, "rb") if fs is not None else fsspec.open(path, "rb")
    )
    head = raw.read(2)
    raw.seek(0)
    if head == _GZIP_MAGIC or path.endswith(".gz"):
        gz = gzip.GzipFile(fileobj=raw, mode="rb")
        stack.callback(gz.close)
        return stack, cast("IO[bytes]", gz)
    return stack, raw


class PassReader:
    """Batches of one worker's files for one pass; iterate once, then ``close()`` (or use
    ``with``). ``stats`` and ``file_reports`` are readable at any time."""

    def __init__(
        self,
        files: Sequence[str],
        config: DataConfig,
        batch_size: int,
        *,
        fmt: Format | None = None,
        fs: AbstractFileSystem | None = None,
        prefetch_blocks: int = DEFAULT_PREFETCH_BLOCKS,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        hold_blocks: int = DEFAULT_HOLD_BLOCKS,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if prefetch_blocks < 1 or block_bytes < 1 or hold_blocks < 1:
            raise ValueError("prefetch_blocks, block_bytes and hold_blocks must be >= 1")
        self._hold_blocks = hold_blocks
        self._files = list(files)
        self._config = config
        self._format = fmt if fmt is not None else make_format(config)
        self._fs = fs
        self._batch_size = batch_size
        self._block_bytes = block_bytes
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch_blocks)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stats = ReadStats()
        self._reports: list[FileReport] = []
        self._thread: threading.Thread | None = None
        self._iterated = False

    @property
    def num_slots(self) -> int:
        return self._format.num_slots

    @property
    def stats(self) -> ReadStats:
        with self._lock:
            return self._stats

    @property
    def file_reports(self) -> list[FileReport]:
        """Per-file line and bad-line counts of the files read so far."""
        with self._lock:
            return list(self._reports)

    @property
    def running(self) -> bool:
        """Whether the background thread is still alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start reading ahead (idempotent); iteration starts it too."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="pass-reader", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the background thread and wait for it (safe to call more than once)."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                self._drain()
                self._thread.join(_POLL_SECONDS)

    def __enter__(self) -> PassReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Batch]:
        if self._iterated:
            raise RuntimeError("a PassReader can be iterated only once")
        self._iterated = True
        self.start()
        return self._batches()

    # --- consumer side ---------------------------------------------------------------------

    def _blocks(self) -> Iterator[Batch]:
        while True:
            item = self._queue.get()
            if isinstance(item, _End):
                return
            if isinstance(item, BaseException):
                raise item
            if item.size:
                yield item

    def _batches(self) -> Iterator[Batch]:
        try:
            yield from self._rechunk(self._blocks())
        finally:
            # Normal end, an error, or the consumer dropping the iterator: the thread stops.
            self.close()

    def _rechunk(self, blocks: Iterator[Batch]) -> Iterator[Batch]:
        size = self._batch_size
        pending: list[Batch] = []
        buffered = 0
        for block in blocks:
            start = 0
            if buffered:
                need = size - buffered
                if block.size < need:
                    pending.append(block)
                    buffered += block.size
                    continue
                pending.append(slice_batch(block, 0, need))
                yield concat_batches(pending)
                pending, buffered, start = [], 0, need
            while block.size - start >= size:
                yield slice_batch(block, start, start + size)
                start += size
            if start < block.size:
                pending, buffered = [slice_batch(block, start, block.size)], block.size - start
        if buffered:
            yield pending[0] if len(pending) == 1 else concat_batches(pending)

    def _drain(self) -> None:
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    # --- producer side (background thread) --------------------------------------------------

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for path in self._files:
                report = FileReport(path)
                with self._lock:
                    self._reports.append(report)
                if not self._produce_file(path, report):
                    return
                with self._lock:
                    self._stats = _bump(self._stats, files=1)
            self._put(_End())
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._put(exc)

    def _produce_file(self, path: str, report: FileReport) -> bool:
        """Hand out one file's batches once its bad-line fraction is known to be within the
        limit (raises ``BadDataError`` otherwise); ``False`` when stopped."""
        blocks = self._read_file(path)
        held: list[Batch] = []
        complete = True
        for parsed in blocks:
            self._record(report, parsed)
            held.append(parsed.batch)
            if len(held) >= self._hold_blocks:
                complete = False
                break
        if not complete:  # a large file: count the rest ahead, re-read it afterwards
            for parsed in blocks:
                self._record(report, parsed)
        if self._stop.is_set():
            return False
        self._check_file(report)
        for batch in held:
            if not self._put(batch):
                return False
        if not complete:
            for i, parsed in enumerate(self._read_file(path)):
                if i >= len(held) and not self._put(parsed.batch):
                    return False
        return not self._stop.is_set()

    def _record(self, report: FileReport, parsed: ParsedBlock) -> None:
        bad = int(parsed.bad_lines.shape[0])
        with self._lock:
            report.lines += parsed.lines
            report.bad_lines += bad
            room = FIRST_BAD_LINES - len(report.first_bad)
            for line, reason in zip(
                parsed.bad_lines[:room], parsed.bad_reasons[:room], strict=True
            ):
                report.first_bad.append((int(line), REASONS[int(reason)]))
            self._stats = _bump(
                self._stats, lines=parsed.lines, bad_lines=bad, examples=parsed.batch.size
            )

    def _read_file(self, path: str) -> Iterator[ParsedBlock]:
        stack, stream = open_data_file(path, self._fs)
        with stack:
            is_gzip = isinstance(stream, gzip.GzipFile)
            parser: BlockParser | None = (
                None if self._format.has_header else self._format.for_file(path, None)
            )
            line = 1
            carry = b""
            while not self._stop.is_set():
                chunk = self._read_chunk(stream, path, is_gzip)
                eof = not chunk
                data = carry + chunk if carry else chunk
                carry = b""
                with self._lock:
                    self._stats = _bump(self._stats, bytes_read=len(chunk))
                if parser is None:
                    newline = data.find(b"\n")
                    if newline < 0 and not eof:
                        carry = data
                        continue
                    if newline < 0 and not data.strip():
                        return  # an empty file: no header, no lines
                    cut = len(data) if newline < 0 else newline
                    parser = self._format.for_file(path, data[:cut])
                    data, line = data[cut + 1 :], 2
                if not eof:
                    cut = data.rfind(b"\n")
                    if cut < 0:
                        carry = data
                        continue
                    data, carry = data[: cut + 1], data[cut + 1 :]
                if data:
                    parsed = parser.parse(np.frombuffer(data, dtype=np.uint8), line)
                    line += parsed.physical_lines
                    yield parsed
                if eof:
                    return

    def _read_chunk(self, stream: IO[bytes], path: str, is_gzip: bool) -> bytes:
        if not is_gzip:
            return stream.read(self._block_bytes)
        try:
            return stream.read(self._block_bytes)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise CorruptFileError(f"{path}: truncated or corrupt gzip file ({exc})") from exc

    def _check_file(self, report: FileReport) -> None:
        limit = self._config.maxBadLineFraction
        with self._lock:
            lines, bad, first = report.lines, report.bad_lines, list(report.first_bad)
        if lines == 0 or bad <= limit * lines:
            return
        raise BadDataError(
            f"{report.path}: {bad} bad of {lines} lines, first bad lines "
            + ", ".join(f"{n} ({why})" for n, why in first)
            + f": {bad / lines:.4%} exceeds maxBadLineFraction={limit} (per file)"
        )


def _bump(stats: ReadStats, **delta: int) -> ReadStats:
    return ReadStats(
        **{k: getattr(stats, k) + delta.get(k, 0) for k in ReadStats.__dataclass_fields__}
    )


def iter_batches(
    files: Sequence[str],
    config: DataConfig,
    batch_size: int,
    **options: Any,
) -> Iterator[Batch]:
    """Batches of ``files`` in order (a ``PassReader`` that closes itself); ``options`` are
    ``PassReader``'s keyword options (``fmt``, ``fs``, ``prefetch_blocks``, ``block_bytes``,
    ``hold_blocks``)."""
    with PassReader(files, config, batch_size, **options) as reader:
        yield from reader
