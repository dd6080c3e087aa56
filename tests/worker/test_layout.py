"""Pass plan (pure) and donefile/part listing (fsspec, local and in-memory)."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from streamtrain_worker.data import layout, timeslices
from streamtrain_worker.data.errors import LayoutError


def test_folders_of_a_day_follow_the_split_interval() -> None:
    assert timeslices.folders_per_day(60) == 24
    assert timeslices.folder_names(60)[:3] == ["0000", "0100", "0200"]
    assert timeslices.folder_names(15)[-1] == "2345"
    assert timeslices.folder_names(60, hourly_names=True)[-1] == "23"
    assert len(timeslices.folder_names(5)) == 288


@pytest.mark.parametrize("interval", [0, -5, 7, 1441])
def test_interval_must_divide_a_day(interval: int) -> None:
    with pytest.raises(LayoutError, match="splitIntervalMinutes"):
        timeslices.folders_per_day(interval)


def test_hourly_names_need_whole_hours() -> None:
    with pytest.raises(LayoutError, match="multiple of 60"):
        timeslices.folder_names(30, hourly_names=True)


def test_passes_per_day_and_divisibility() -> None:
    assert timeslices.passes_per_day(60, 1) == 24
    assert timeslices.passes_per_day(15, 4) == 24
    assert timeslices.passes_per_day(60, 24) == 1
    with pytest.raises(LayoutError, match="splitsPerPass"):
        timeslices.passes_per_day(60, 5)


def test_pass_folders_are_consecutive_and_cover_the_day_once() -> None:
    root = "s3://logs/ctr/"
    seen = []
    for p in range(1, 7):
        seen += timeslices.pass_folders(root, "20261101", p, 60, 4)
    assert seen == [f"s3://logs/ctr/20261101/{h:02d}00" for h in range(24)]
    assert timeslices.pass_folders("/d", "20261101", 2, 30, 2, hourly_names=False) == [
        "/d/20261101/0100",
        "/d/20261101/0130",
    ]
    assert timeslices.pass_folders("/d", "20261101", 3, 60, 1, hourly_names=True) == [
        "/d/20261101/02"
    ]


@pytest.mark.parametrize("pass_index", [0, 25])
def test_pass_index_out_of_range(pass_index: int) -> None:
    with pytest.raises(LayoutError, match=f"pass {pass_index}"):
        timeslices.pass_folders("/d", "20261101", pass_index, 60, 1)


def test_day_arithmetic() -> None:
    assert timeslices.next_day("20261130") == "20261201"
    assert timeslices.next_day("20261231") == "20270101"
    assert timeslices.next_day("20280228") == "20280229"
    assert timeslices.days_between("20261230", "20270102") == [
        "20261230",
        "20261231",
        "20270101",
        "20270102",
    ]
    assert timeslices.days_between("20261102", "20261101") == []


@pytest.mark.parametrize("bad", ["20261131", "2026111", "2026-11-01", "20261301", "abcdefgh"])
def test_invalid_days_are_errors(bad: str) -> None:
    with pytest.raises(LayoutError, match=bad):
        timeslices.next_day(bad)


def test_next_pass_and_iteration() -> None:
    assert timeslices.next_pass("20261101", 1, 2) == ("20261101", 2)
    assert timeslices.next_pass("20261101", 2, 2) == ("20261102", 1)
    passes = list(timeslices.iter_passes("20261101", "20261102", 60, 12))
    assert passes == [("20261101", 1), ("20261101", 2), ("20261102", 1), ("20261102", 2)]
    forever = timeslices.iter_passes("20261231", None, 1440, 1)
    assert [next(forever) for _ in range(3)] == [("20261231", 1), ("20270101", 1), ("20270102", 1)]


def test_folder_ready_and_listing_on_local_disk(tmp_path: Path) -> None:
    folder = tmp_path / "20261101" / "0000"
    folder.mkdir(parents=True)
    assert not layout.folder_ready(str(folder))
    (folder / "part-00001").write_bytes(b"x" * 5)
    (folder / "part-00000.gz").write_bytes(b"y" * 3)
    (folder / ".part-00002.crc").write_bytes(b"")
    (folder / "_temporary").mkdir()
    (folder / "part-00003.tmp").write_bytes(b"zz")
    (folder / "_SUCCESS").write_bytes(b"")
    assert layout.folder_ready(str(folder))
    assert layout.list_part_files(str(folder)) == [
        (str(folder / "part-00000.gz"), 3),
        (str(folder / "part-00001"), 5),
    ]
    assert layout.folder_ready(str(folder), donefile="DONE") is False
    assert layout.list_part_files(str(tmp_path / "missing")) == []


def test_scan_counts_what_it_skips_and_records_size_and_version(tmp_path: Path) -> None:
    folder = tmp_path / "0000"
    (folder / "_temporary" / "0").mkdir(parents=True)
    (folder / "sub").mkdir()
    for name in ("part-0", ".part-0.crc", "_started", "part-1.tmp", "part-2.crc", "_SUCCESS"):
        (folder / name).write_bytes(b"abc")
    listing = layout.scan_folder(str(folder))
    # The donefile is expected, not skipped; everything else that is not data is counted.
    assert listing.skipped == [".part-0.crc", "_started", "_temporary/", "part-1.tmp",
                               "part-2.crc", "sub/"]  # fmt: skip
    (data,) = listing.files
    assert (data.path, data.size) == (str(folder / "part-0"), 3)
    assert data.version == str((folder / "part-0").stat().st_mtime)
    # An object store's etag wins over a modification time.
    assert layout.file_version({"ETag": '"9a0364b9"', "mtime": 1.0}) == '"9a0364b9"'
    assert layout.file_version({"size": 3}) == ""


def test_listing_through_an_fsspec_url_keeps_the_protocol() -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe({"/bucket/20261101/0100/part-1": b"abc", "/bucket/20261101/0100/part-0": b"a"})
    folder = "memory://bucket/20261101/0100"
    assert not layout.folder_ready(folder, "_DONE")
    fs.pipe({"/bucket/20261101/0100/_DONE": b""})
    assert layout.folder_ready(folder, "_DONE")
    files = layout.list_part_files(folder, "_DONE")
    assert files == [
        ("memory:///bucket/20261101/0100/part-0", 1),
        ("memory:///bucket/20261101/0100/part-1", 3),
    ]
    with fsspec.open(files[1][0], "rb") as f:
        assert f.read() == b"abc"
    fs.rm("/bucket", recursive=True)


def test_an_injected_filesystem_is_used() -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe({"/inj/20261101/0000/part-0": b"abc", "/inj/20261101/0000/_SUCCESS": b""})
    try:
        assert layout.folder_ready("/inj/20261101/0000", fs=fs)
        assert layout.list_part_files("/inj/20261101/0000", fs=fs) == [
            ("/inj/20261101/0000/part-0", 3)
        ]
    finally:
        fs.rm("/inj", recursive=True)


def test_a_folder_names_its_hour_of_day() -> None:
    """Every name ``folder_names`` gives reads back as its hour; anything else is refused
    by name."""
    for interval, hourly in ((30, False), (180, False), (60, True)):
        for name in timeslices.folder_names(interval, hourly):
            assert timeslices.folder_hour(name) == int(name[:2])
    assert timeslices.folder_names(30)[3] == "0130"
    assert timeslices.folder_hour("0130") == 1
    for bad in ("2400", "1", "ab30", "01300", "_SUCCESS"):
        with pytest.raises(LayoutError, match=repr(bad)):
            timeslices.folder_hour(bad)
