"""The published model folder format: round trips, and errors that name the file and line."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import fsspec
import pytest

from streamtrain_worker.publishing.model_folder import (
    DONEFILE,
    MODEL_MANIFEST,
    DoneLine,
    ModelFile,
    ModelFormatError,
    ModelKind,
    ModelManifest,
    Serving,
    model_key,
    parse_donefile,
    read_donefile,
    read_manifest,
    verify_files,
    with_line,
)

DELTA = DoneLine("20261102/delta-3", ModelKind.DELTA, "20261102", 3, "20261102/base", 1.5e9)
BASE = DoneLine("20261102/base", ModelKind.BASE, "20261101", 4, None, 1.4e9)


def manifest(**changes: Any) -> ModelManifest:
    fields: dict[str, Any] = {
        "key": "20261102/delta-3",
        "kind": ModelKind.DELTA,
        "day": "20261102",
        "pass_index": 3,
        "base": "20261102/base",
        "save_mode": 1,
        "keys": 120,
        "tombstones": 4,
        "metrics": {"auc": 0.71, "examples": 150},
        "files": (
            ModelFile.of("sparse/data-s000/part-00000.bin", b"kv" * 8, rows=120),
            ModelFile.of("dense/dense.pt", b"torchscript"),
        ),
        "serving": Serving({"format": "criteo"}, "embedding", 1024, "dnn"),
    }
    fields.update(changes)
    return ModelManifest(**fields)


def test_model_keys() -> None:
    assert model_key(ModelKind.DELTA, "20261101", 3) == "20261101/delta-3"
    assert model_key(ModelKind.BASE, "20261102") == "20261102/base"
    assert model_key(ModelKind.BATCH, "20261101", 4) == "20261101/batch"


def test_donefile_lines_round_trip() -> None:
    text = ""
    for line in (BASE, DELTA):
        new = with_line(text, line, DONEFILE)
        assert new is not None
        text = new
    assert parse_donefile(text, DONEFILE) == [BASE, DELTA]
    assert with_line(text, DELTA, DONEFILE) is None  # published once: nothing to write


def test_a_line_as_earlier_releases_wrote_it_still_parses() -> None:
    line = (
        '{"base": null, "day": "20261101", "key": "20261101/delta-1", "kind": "delta", '
        '"manifest": "20261101/delta-1/MODEL.json", "pass": 1, "publishedAt": 1700000000.25}'
    )
    parsed = DoneLine.parse(line, "x")
    assert parsed == DoneLine(
        "20261101/delta-1", ModelKind.DELTA, "20261101", 1, None, 1.7e9 + 0.25
    )
    assert parsed.render() == line


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "full"}, "field 'kind' is 'full', not one of delta, base, batch"),
        ({"pass": "3"}, "field 'pass' has the wrong type: '3'"),
        ({"pass": -1}, "field 'pass' is negative: -1"),
        ({"day": "2026-11-02"}, "field 'day' is '2026-11-02', not YYYYMMDD"),
        ({"key": "../etc/delta-3"}, "field 'key' is not a relative path"),
        ({"manifest": "elsewhere/MODEL.json"}, "field 'manifest' is 'elsewhere/MODEL.json'"),
        ({"publishedAt": True}, "field 'publishedAt' has the wrong type: True"),
        ({"base": 7}, "field 'base' has the wrong type: 7"),
    ],
)
def test_a_bad_field_is_named_with_file_and_line(change: dict[str, Any], message: str) -> None:
    bad = json.loads(DELTA.render()) | change
    text = BASE.render() + "\n\n" + json.dumps(bad) + "\n"
    with pytest.raises(ModelFormatError, match=rf"^/export/donefile\.txt:3: {message}"):
        parse_donefile(text, "/export/donefile.txt")


def test_missing_fields_broken_json_and_repeated_keys_are_named() -> None:
    no_base = json.loads(DELTA.render())
    del no_base["base"]
    with pytest.raises(ModelFormatError, match=r"^d:1: field 'base' is missing"):
        parse_donefile(json.dumps(no_base), "d")
    with pytest.raises(ModelFormatError, match=r"^d:2: not JSON"):
        parse_donefile(BASE.render() + '\n{"key": "20261102/de', "d")
    with pytest.raises(ModelFormatError, match=r"^d:1: not a JSON object"):
        parse_donefile("[1, 2]", "d")
    with pytest.raises(ModelFormatError, match=r"^d:2: model '20261102/base' is listed twice"):
        parse_donefile(BASE.render() + "\n" + BASE.render(), "d")


def test_manifest_round_trips_with_and_without_serving_fields() -> None:
    for m in (manifest(), manifest(serving=None, base=None)):
        assert ModelManifest.parse(m.render(), MODEL_MANIFEST) == m
    rendered = json.loads(manifest().render())
    assert rendered["format"] == "streamtrain-model" and rendered["version"] == 1
    assert (rendered["pass"], rendered["table"], rendered["numBuckets"]) == (3, "embedding", 1024)
    assert "rows" not in rendered["files"][1]  # only sparse parts count rows


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 2}, "format 'streamtrain-model' version 2, expected 'streamtrain-model'"),
        ({"keys": 1.5}, "field 'keys' has the wrong type: 1.5"),
        ({"metrics": {"auc": "high"}}, "metrics: field 'auc' has the wrong type: 'high'"),
        ({"files": [{"path": "/abs", "size": 1, "sha256": "0" * 64}]}, r"files\[0\]: field 'path'"),
        ({"files": [{"path": "a", "size": 1, "sha256": "nope"}]}, r"files\[0\]: field 'sha256'"),
        ({"table": 3}, "field 'table' has the wrong type: 3"),
    ],
)
def test_a_bad_manifest_field_is_named_with_its_file(change: dict[str, Any], message: str) -> None:
    bad = json.loads(manifest().render()) | change
    with pytest.raises(ModelFormatError, match=rf"^/x/MODEL\.json: {message}"):
        ModelManifest.parse(json.dumps(bad), "/x/MODEL.json")


def test_a_reader_that_needs_serving_fields_is_told_which_file_lacks_them() -> None:
    with pytest.raises(ModelFormatError, match=r"^/x/MODEL\.json: no 'data', 'table'"):
        manifest(serving=None).serving_info("/x/MODEL.json")


def test_read_and_verify_through_a_filesystem() -> None:
    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    root = "/model-folder-test"
    m = manifest()
    assert read_donefile(fs, root) == []  # nothing published yet
    fs.pipe_file(f"{root}/20261102/delta-3/sparse/data-s000/part-00000.bin", b"kv" * 8)
    fs.pipe_file(f"{root}/20261102/delta-3/dense/dense.pt", b"torchscript")
    fs.pipe_file(f"{root}/20261102/delta-3/{MODEL_MANIFEST}", m.render())
    fs.pipe_file(f"{root}/{DONEFILE}", (DELTA.render() + "\n").encode())
    assert read_donefile(fs, root) == [DELTA]
    assert read_manifest(fs, root, DELTA.key) == m
    verify_files(fs, root, m)
    fs.pipe_file(f"{root}/20261102/delta-3/dense/dense.pt", b"tampered!!!")
    with pytest.raises(ModelFormatError, match=r"delta-3/dense/dense\.pt: size or checksum"):
        verify_files(fs, root, m)
    verify_files(fs, root, m, lambda f: f.path.startswith("sparse/"))  # only what is asked
    fs.copy(f"{root}/20261102/delta-3", f"{root}/20261102/delta-4", recursive=True)
    with pytest.raises(ModelFormatError, match="field 'key' is '20261102/delta-3', expected"):
        read_manifest(fs, root, "20261102/delta-4")  # a manifest copied to the wrong folder
    fs.rm(root, recursive=True)


def test_a_file_entry_checks_bytes() -> None:
    entry = ModelFile.of("dense/dense.json", b"{}")
    assert entry.sha256 == hashlib.sha256(b"{}").hexdigest() and entry.size == 2
    entry.check(b"{}", "here")
    with pytest.raises(ModelFormatError, match=r"^here: size or checksum mismatch"):
        entry.check(b"[]", "here")
