"""``streamtrain serve``: KServe v2 over HTTP, gRPC, exactly one version per response,
served == predict, 4xx naming the field, rollback and pin, refused models never served."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from streamtrain_tools.bench.serving.models import Export, keys_of, lines, rows_for
from streamtrain_worker.proto import serving_pb2
from streamtrain_worker.publishing.model_folder import ModelKind
from streamtrain_worker.serving.tables import EmbeddedTable, RedisTable

from .conftest import RedisProcess
from .stack import Stack, expected_scores

IDS = [*range(12), 99]  # 99: unknown to every model (lookups missed)
ROWS = lines(IDS).splitlines()


def publish_all_keys_changed(ex: Export, pass_index: int, **kwargs: object) -> str:
    k = keys_of(range(12))
    return ex.publish(ModelKind.DELTA, "20261101", pass_index, k, rows_for(k, pass_index), **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    ex = Export(tmp_path / "export")
    s = Stack(ex.root, EmbeddedTable())
    s.export = ex  # type: ignore[attr-defined]
    try:
        yield s
    finally:
        s.stop()


def test_ready_waits_for_a_verified_model_and_scores_equal_predict(
    stack: Stack, tmp_path: Path
) -> None:
    ex: Export = stack.export  # type: ignore[attr-defined]
    assert stack.call("GET", "/v2/health/ready")[0] == 503
    assert stack.infer(ROWS)[0] == 503
    key = publish_all_keys_changed(ex, 1)
    stack.wait_served(key)
    assert stack.call("GET", "/v2/health/ready") == (200, {"ready": True})
    status, body = stack.infer(ROWS)
    assert status == 200, body
    assert body["model_name"] == "ctr" and body["model_version"] == key
    assert body["parameters"]["version_id"] == 1
    (out,) = body["outputs"]
    assert out["name"] == "score" and out["shape"] == [len(ROWS)]
    want = expected_scores(ex.root, key, "\n".join(ROWS) + "\n", tmp_path)
    assert np.max(np.abs(np.array(out["data"]) - want)) <= 1e-6
    # Column maps and gRPC give the same numbers.
    columns = [{"user": str(i), "item": str(i), "hist": [str(i)]} for i in IDS]
    status, body = stack.call(
        "POST", "/v2/models/ctr/infer", {"inputs": [{"name": "columns", "data": columns}]}
    )
    assert status == 200, body
    assert np.max(np.abs(np.array(body["outputs"][0]["data"]) - want)) <= 1e-6
    reply = stack.stub.ModelInfer(serving_pb2.ModelInferRequest(model_name="ctr", rows=ROWS))
    assert reply.model_version == key and reply.version_id == 1
    assert np.max(np.abs(np.array(reply.scores) - want)) <= 1e-6
    assert stack.stub.ServerReady(serving_pb2.ServerReadyRequest()).ready
    meta = stack.call("GET", "/v2/models/ctr")[1]
    assert meta["parameters"]["served"]["key"] == key
    metrics = stack.server.metrics.registry
    assert metrics.get_sample_value("streamtrain_serving_version") == 1
    assert metrics.get_sample_value("streamtrain_serving_lookups_missed_total") >= 3 * 3


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{not json", "body"),
        ({"inputs": []}, "inputs"),
        ({"inputs": [{"name": "tensor", "data": []}]}, "inputs[0].name"),
        ({"inputs": [{"name": "rows", "data": "x"}]}, "inputs[0].data"),
        ({"inputs": [{"name": "rows", "shape": [3], "data": ["1:user"]}]}, "inputs[0].shape"),
        ({"inputs": [{"name": "rows", "data": ["1:user click:0", "oops"]}]}, "rows[1]"),
        ({"inputs": [{"name": "rows", "data": ["1:user", 7]}]}, "rows[1]"),
        ({"inputs": [{"name": "columns", "data": [{"shop": "1"}]}]}, "columns[0].shop"),
        ({"inputs": [{"name": "columns", "data": [{"user": 1.5}]}]}, "columns[0].user"),
        ({"inputs": [{"name": "rows", "data": []}]}, "rows"),
    ],
)
def test_bad_requests_are_4xx_naming_the_field(stack: Stack, body: object, named: str) -> None:
    ex: Export = stack.export  # type: ignore[attr-defined]
    stack.wait_served(publish_all_keys_changed(ex, 1))
    status, reply = stack.call("POST", "/v2/models/ctr/infer", body)
    assert status == 400, reply
    assert reply["error"].startswith(named + ":"), reply
    if named == "rows[1]":
        with pytest.raises(grpc.RpcError) as err:
            stack.stub.ModelInfer(
                serving_pb2.ModelInferRequest(rows=[*body["inputs"][0]["data"][:1], "oops"])
            )  # type: ignore[index]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "rows[1]" in err.value.details()
    assert stack.call("POST", "/v2/models/other/infer", {"inputs": []})[0] == 404
    assert stack.call("POST", "/v2/models/ctr/pin", {"version": "x"})[0] == 400
    assert stack.call("POST", "/v2/models/ctr/pin", {"version": 42})[0] == 409


class Load:
    """Requests in a loop on two threads; every response recorded (version, scores)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.responses: list[tuple[float, str, list[float]]] = []
        self.errors: list[object] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(2)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            status, body = self.stack.infer(ROWS)
            if status != 200:
                self.errors.append(body)
                continue
            self.responses.append(
                (time.monotonic(), body["model_version"], body["outputs"][0]["data"])
            )

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def assert_untorn(load: Load, expected: dict[str, list[float]]) -> None:
    """Every response's scores are exactly those of the version it names."""
    assert not load.errors, load.errors[:3]
    assert load.responses
    for _, key, scores in load.responses:
        assert key in expected, key
        assert np.max(np.abs(np.array(scores) - expected[key])) <= 1e-6, key


def test_rollback_and_pin_under_load_take_effect_within_a_second(
    stack: Stack, tmp_path: Path
) -> None:
    ex: Export = stack.export  # type: ignore[attr-defined]
    text = "\n".join(ROWS) + "\n"
    k1 = publish_all_keys_changed(ex, 1)
    stack.wait_served(k1)
    load = Load(stack)
    try:
        k2 = publish_all_keys_changed(ex, 2)
        stack.wait_served(k2)
        time.sleep(0.2)
        asked = time.monotonic()
        status, body = stack.call("POST", "/v2/models/ctr/rollback")
        assert status == 200 and body == {"served": 1}
        time.sleep(1.2)
        late = [key for at, key, _ in load.responses if at > asked + 1.0]
        assert late and set(late) == {k1}
        # A new delta while pinned: delivered, not served.
        k3 = publish_all_keys_changed(ex, 3)
        deadline = time.monotonic() + 20
        while stack.table.state().live != 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stack.table.state().live == 3 and stack.server.scorer.current.version.key == k1
        status, _ = stack.call("POST", "/v2/models/ctr/pin", {"version": 0})
        assert status == 200
        stack.wait_served(k3, timeout=1.0)
        time.sleep(0.3)
    finally:
        load.stop()
    expected = {k: expected_scores(ex.root, k, text, tmp_path) for k in (k1, k2, k3)}
    assert_untorn(load, expected)
    assert {key for _, key, _ in load.responses} == {k1, k2, k3}


def test_refused_models_are_never_served_under_load(stack: Stack, tmp_path: Path) -> None:
    ex: Export = stack.export  # type: ignore[attr-defined]
    k1 = publish_all_keys_changed(ex, 1, metrics={"auc": 0.75})
    stack.wait_served(k1)
    load = Load(stack)
    try:
        k = keys_of(range(12))
        nan_rows = rows_for(k, 2)
        nan_rows[3, 5] = np.inf
        bad_rows = ex.publish(ModelKind.DELTA, "20261101", 2, k, nan_rows, metrics={"auc": 0.75})
        dropped = publish_all_keys_changed(ex, 3, metrics={"auc": 0.6})
        deadline = time.monotonic() + 20
        while stack.table.state().cursor < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        load.stop()
    assert {key for _, key, _ in load.responses} == {k1}
    _, versions = stack.call("GET", "/v2/models/ctr/versions")
    assert versions["refused"] == 2 and versions["served"] == 1
    reasons = {r["key"]: r["reason"] for r in versions["refusals"]}
    assert "not finite" in reasons[bad_rows] and "below the live model" in reasons[dropped]
    registry = stack.server.metrics.registry
    assert registry.get_sample_value("streamtrain_serving_refused_models_total") == 2
    text = "\n".join(ROWS) + "\n"
    assert_untorn(load, {k1: expected_scores(ex.root, k1, text, tmp_path)})


def test_redis_backed_server_never_tears_while_every_key_changes(
    redis_server: RedisProcess, tmp_path: Path
) -> None:
    ex = Export(tmp_path / "export")
    k1 = publish_all_keys_changed(ex, 1)
    # The server reads Redis; the delivery runs beside it (as `streamtrain deliver` would).
    deliverer = Stack(ex.root, RedisTable(redis_server.client, "p:"), deliver=True)
    server = Stack(ex.root, RedisTable(redis_server.client, "p:"), deliver=False)
    try:
        server.wait_served(k1)
        load = Load(server)
        try:
            keys = [k1] + [publish_all_keys_changed(ex, p) for p in range(2, 7)]
            server.wait_served(keys[-1])
            time.sleep(0.2)
        finally:
            load.stop()
    finally:
        server.stop()
        deliverer.stop()
    text = "\n".join(ROWS) + "\n"
    expected = {k: expected_scores(ex.root, k, text, tmp_path) for k in keys}
    assert_untorn(load, expected)
    assert len({key for _, key, _ in load.responses}) >= 2


def test_the_demo_request_is_served_by_the_newest_model(tmp_path: Path) -> None:
    from streamtrain_worker.serving.server import show_one_request

    ex = Export(tmp_path / "export")
    key = publish_all_keys_changed(ex, 1)
    data = tmp_path / "part-00000"
    data.write_text("\n".join(ROWS) + "\n")
    out = io.StringIO()
    answer = show_one_request(str(ex.root), data, out)
    assert answer["model_version"] == key and answer["outputs"][0]["shape"] == [2]
    assert "POST http://127.0.0.1:" in out.getvalue() and key in out.getvalue()


def test_streamtrain_cli_runs_the_serving_commands(tmp_path: Path) -> None:
    """``streamtrain pin`` goes through the operator's CLI into this room (a new process)."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "streamtrain_operator.cli", "pin", "--redis",
         "redis://127.0.0.1:1/0", "3"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("error: ") and "Traceback" not in run.stderr
