"""Checkpoints and inference models on a real S3-compatible server (moto), through s3fs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest
from moto.server import ThreadedMotoServer

from streamtrain_operator.run.export import read_donefile, verify_model

from .conftest import streamtrain


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (free port) with bucket ``models``; credentials and the
    endpoint reach child processes through the environment, as in a pod."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("models")
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.mark.timeout(240)
def test_run_publishes_models_and_checkpoints_to_s3(
    s3_endpoint: str, job_file: Callable[..., Path]
) -> None:
    job = job_file(
        days=1,
        checkpoint={"path": "s3://models/ckpt", "everyPasses": 2},
        export={"path": "s3://models/serving"},
    )
    root = job.parent
    run = streamtrain("run", str(job), cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "export delta -> s3://models/serving/20261101/delta-1" in run.stdout

    lines = read_donefile("s3://models/serving")
    assert [d.key for d in lines] == [
        "20261101/delta-1",
        "20261101/delta-2",
        "20261101/delta-3",
        "20261101/delta-4",
        "20261102/base",
        "20261101/batch",
    ]
    for line in lines:
        manifest = verify_model("s3://models/serving", line.key)
        assert manifest.keys > 0
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    assert fs.exists("models/ckpt/20261101/pass-4-g1/MANIFEST.json")
    # The state lives next to the rendered configs when checkpoints are remote.
    state = json.loads((root / ".streamtrain" / "e2e" / "state.json").read_text())
    assert state["lastCheckpoint"]["uri"] == "s3://models/ckpt/20261101/pass-4-g1"

    parts = [str(p) for p in sorted((root / "data" / "20261101" / "1800").glob("part-*"))]
    predicted = streamtrain(
        "predict", "--export", "s3://models/serving", "--json", *parts, cwd=root
    )
    assert predicted.returncode == 0, predicted.stderr
    result = json.loads(predicted.stdout.strip().splitlines()[-1])
    assert result["model"] == "20261102/base" and result["examples"] == 150
