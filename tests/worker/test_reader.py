"""PassReader: fixed-size batches, block boundaries, gzip, prefetch, bad-line policy, empties."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import fsspec
import numpy as np
import pytest

from streamtrain_tools.bench.worker import parse as bench_parse
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.data import layout
from streamtrain_worker.data.batch import Batch, concat_batches
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.errors import BadDataError, CorruptFileError
from streamtrain_worker.data.formats import make_format
from streamtrain_worker.data.reader import PassReader, iter_batches

CRITEO = SAMPLES_DIR / "criteo_kaggle_sample_train.txt"
AVAZU = SAMPLES_DIR / "avazu_sample_train.csv"
CRITEO_CFG = DataConfig.from_dict({"format": "criteo"})


def whole_file(cfg: DataConfig, raw: bytes) -> Batch:
    fmt = make_format(cfg)
    header = None
    if fmt.has_header:
        header, _, raw = raw.partition(b"\n")
    return fmt.for_file("x", header).parse(np.frombuffer(raw, np.uint8), 1).batch


@pytest.mark.parametrize("block_bytes", [997, 64 * 1024, 4 << 20])
def test_batches_are_fixed_size_and_equal_a_whole_file_parse(
    tmp_path: Path, block_bytes: int
) -> None:
    raw = CRITEO.read_bytes()
    cut = raw.index(b"\n", len(raw) // 2) + 1
    (tmp_path / "part-0").write_bytes(raw[: cut - 1])  # no newline at the end of the file
    (tmp_path / "part-1").write_bytes(raw[cut:])
    files = [str(tmp_path / "part-0"), str(tmp_path / "part-1")]
    batches = list(iter_batches(files, CRITEO_CFG, 500, block_bytes=block_bytes))
    assert [b.size for b in batches] == [500] * 14 + [200]
    joined = concat_batches(batches)
    expected = whole_file(CRITEO_CFG, raw)
    assert np.array_equal(joined.keys, expected.keys)
    assert np.array_equal(joined.offsets, expected.offsets)
    assert np.array_equal(joined.labels, expected.labels)


def test_reader_output_matches_single_parse_exactly(tmp_path: Path) -> None:
    raw = AVAZU.read_bytes()
    path = tmp_path / "part-0.csv"
    path.write_bytes(raw)
    cfg = DataConfig.from_dict({"format": "avazu"})
    batches = list(iter_batches([str(path)], cfg, 333, block_bytes=4096))
    joined = concat_batches(batches)
    expected = whole_file(cfg, raw)
    assert np.array_equal(joined.keys, expected.keys)
    assert np.array_equal(joined.offsets, expected.offsets)
    assert np.array_equal(joined.labels, expected.labels)
    assert [b.size for b in batches][-1] == 8087 % 333


def test_gzip_by_magic_bytes_and_extension(tmp_path: Path) -> None:
    raw = CRITEO.read_bytes()
    (tmp_path / "a.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "b").write_bytes(gzip.compress(raw))  # no extension: the magic bytes tell
    with PassReader([str(tmp_path / "a.gz"), str(tmp_path / "b")], CRITEO_CFG, 1024) as reader:
        total = sum(b.size for b in reader)
        stats = reader.stats
    assert total == 14400
    assert (stats.files, stats.lines, stats.bad_lines, stats.examples) == (2, 14400, 0, 14400)
    assert stats.bytes_read == 2 * len(raw)


def test_truncated_gzip_names_the_file(tmp_path: Path) -> None:
    blob = gzip.compress(CRITEO.read_bytes())
    path = tmp_path / "part-7.gz"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CorruptFileError, match=r"part-7\.gz: truncated or corrupt gzip"):
        list(iter_batches([str(path)], CRITEO_CFG, 512, block_bytes=65536))


def test_bad_line_threshold_is_per_file_and_names_the_file_and_lines(tmp_path: Path) -> None:
    good = CRITEO.read_bytes().split(b"\n")[:1000]
    broken = good[:]
    broken[4] = b"not\tenough"
    broken[9] = broken[9].replace(b"\t", b"\tx", 1)
    (tmp_path / "part-0").write_bytes(b"\n".join(good) + b"\n")
    (tmp_path / "part-1").write_bytes(b"\n".join(broken) + b"\n")
    files = [str(tmp_path / "part-0"), str(tmp_path / "part-1")]
    loose = DataConfig.from_dict({"format": "criteo", "maxBadLineFraction": 0.002})
    with PassReader(files, loose, 256) as reader:
        assert sum(b.size for b in reader) == 1998  # 2 bad of part-1's 1000 = 0.002: not above
        assert reader.stats.bad_lines == 2
        report = reader.file_reports[1]
        assert report.first_bad == [(5, "wrong column count"), (10, "unparsable number")]
    # 2 bad of 2000 lines in the pass is 0.001, but part-1 alone is 0.002: it fails.
    strict = DataConfig.from_dict({"format": "criteo", "maxBadLineFraction": 0.0015})
    seen = 0
    with pytest.raises(BadDataError) as info:
        for batch in iter_batches(files, strict, 256):
            seen += batch.size
    message = str(info.value)
    assert f"{files[1]}: 2 bad of 1000 lines, first bad lines " in message
    assert "5 (wrong column count), 10 (unparsable number)" in message
    assert "0.2000% exceeds maxBadLineFraction=0.0015 (per file)" in message
    assert files[0] not in message
    assert seen == 768  # part-0's full batches; nothing of part-1


@pytest.mark.parametrize("hold_blocks", [1, 64])
def test_a_file_of_garbage_hands_out_none_of_its_examples(tmp_path: Path, hold_blocks: int) -> None:
    """A small all-garbage file beside a large good one: a per-pass limit would let it
    through (5 of 5005 lines); per file it fails before anything of it is trained. With
    ``hold_blocks=1`` the file is larger than what is held and counted ahead instead."""
    good = CRITEO.read_bytes().split(b"\n")[:5000]
    (tmp_path / "part-0").write_bytes(b"".join(b"garbage %d\n" % i for i in range(4)) + good[0])
    (tmp_path / "part-1").write_bytes(b"\n".join(good) + b"\n")
    files = [str(tmp_path / "part-0"), str(tmp_path / "part-1")]
    cfg = DataConfig.from_dict({"format": "criteo", "maxBadLineFraction": 0.002})
    seen = 0
    with pytest.raises(BadDataError, match=r"part-0: 4 bad of 5 lines, first bad lines 1 \("):
        for batch in iter_batches(files, cfg, 2, block_bytes=16, hold_blocks=hold_blocks):
            seen += batch.size
    assert seen == 0


def test_a_file_larger_than_the_hold_is_counted_ahead_and_read_again_in_full(
    tmp_path: Path,
) -> None:
    raw = CRITEO.read_bytes()
    (tmp_path / "part-0").write_bytes(raw)
    batches = list(
        iter_batches([str(tmp_path / "part-0")], CRITEO_CFG, 500, hold_blocks=3, block_bytes=65536)
    )
    joined = concat_batches(batches)
    expected = whole_file(CRITEO_CFG, raw)
    assert np.array_equal(joined.keys, expected.keys)
    assert np.array_equal(joined.labels, expected.labels)
    broken = raw.split(b"\n")
    broken[-2] = b"bad\tline"  # the last line: known only after the held blocks
    (tmp_path / "part-1").write_bytes(b"\n".join(broken))
    strict = DataConfig.from_dict({"format": "criteo", "maxBadLineFraction": 0.00001})
    seen = 0
    with pytest.raises(BadDataError, match="part-1: 1 bad of 7200 lines"):
        for batch in iter_batches(
            [str(tmp_path / "part-1")], strict, 500, hold_blocks=3, block_bytes=65536
        ):
            seen += batch.size
    assert seen == 0


def test_empty_files_and_empty_passes(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "blank").write_bytes(b"\n\n")
    (tmp_path / "empty.gz").write_bytes(gzip.compress(b""))
    files = [str(tmp_path / n) for n in ("empty", "blank", "empty.gz")]
    assert list(iter_batches(files, CRITEO_CFG, 10)) == []
    assert list(iter_batches([], CRITEO_CFG, 10)) == []
    avazu = DataConfig.from_dict({"format": "avazu"})
    header_only = tmp_path / "header.csv"
    header_only.write_bytes(AVAZU.read_bytes().split(b"\n")[0] + b"\n")
    with PassReader([str(header_only), str(tmp_path / "empty")], avazu, 10) as reader:
        assert list(reader) == []
        assert reader.stats.files == 2
        assert reader.stats.lines == 0


def test_reads_ahead_in_the_background_and_stops_on_close(tmp_path: Path) -> None:
    raw = CRITEO.read_bytes()
    files = []
    for i in range(3):
        (tmp_path / f"part-{i}").write_bytes(raw)
        files.append(str(tmp_path / f"part-{i}"))
    reader = PassReader(files, CRITEO_CFG, 100, prefetch_blocks=8)
    batches = iter(reader)
    first = next(batches)
    assert first.size == 100
    deadline = time.monotonic() + 30
    while reader.stats.files < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # polling with a timeout, not synchronisation by sleeping
    # All three files were parsed while the consumer held one batch.
    assert reader.stats.files == 3
    assert reader.stats.examples == 21600
    reader.close()
    assert not reader.running
    with pytest.raises(RuntimeError, match="only once"):
        iter(reader)


def test_close_mid_file_with_a_full_queue(tmp_path: Path) -> None:
    raw = CRITEO.read_bytes()
    (tmp_path / "part-0").write_bytes(raw * 4)
    reader = PassReader(
        [str(tmp_path / "part-0")], CRITEO_CFG, 64, prefetch_blocks=1, block_bytes=8192
    )
    with reader:
        next(iter(reader))
    assert not reader.running
    assert reader.stats.files == 0


def test_bench_parse_measures_every_format() -> None:
    rates = bench_parse.measure_all(SAMPLES_DIR, min_seconds=0.0)
    assert set(rates) == {"criteo", "avazu", "libsvm", "csv", "slot"}
    assert all(rate > 0 for rate in rates.values())
    assert bench_parse.measure("criteo", CRITEO, min_seconds=0.0, data_dir=SAMPLES_DIR) > 0
    with pytest.raises(ValueError, match="no sample config for format 'slot'"):
        bench_parse.measure("slot", CRITEO, data_dir=SAMPLES_DIR)


def test_dropping_the_iterator_stops_the_thread(tmp_path: Path) -> None:
    (tmp_path / "part-0").write_bytes(CRITEO.read_bytes() * 2)
    reader = PassReader(
        [str(tmp_path / "part-0")], CRITEO_CFG, 32, prefetch_blocks=1, block_bytes=4096
    )
    batches = iter(reader)
    next(batches)
    del batches  # the generator's cleanup closes the reader
    deadline = time.monotonic() + 30
    while reader.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not reader.running


def test_reads_any_fsspec_url() -> None:
    fs = fsspec.filesystem("memory")
    raw = CRITEO.read_bytes()
    fs.pipe(
        {"/ctr/20261101/0000/part-0.gz": gzip.compress(raw), "/ctr/20261101/0000/_SUCCESS": b""}
    )
    try:
        folder = "memory://ctr/20261101/0000"
        assert layout.folder_ready(folder)
        files = [path for path, _ in layout.list_part_files(folder)]
        assert sum(b.size for b in iter_batches(files, CRITEO_CFG, 4096)) == 7200
    finally:
        fs.rm("/ctr", recursive=True)


def test_a_gz_name_without_gzip_content_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "part-3.gz"
    path.write_bytes(CRITEO.read_bytes()[:1000])
    with pytest.raises(CorruptFileError, match=r"part-3\.gz: truncated or corrupt gzip"):
        list(iter_batches([str(path)], CRITEO_CFG, 16))
