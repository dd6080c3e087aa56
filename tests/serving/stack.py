"""A serving stack in this process: table, delivery, scorer, HTTP and gRPC on free ports."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from streamtrain_worker.proto import serving_pb2_grpc
from streamtrain_worker.publishing.predict import RowWriter, load_model, score
from streamtrain_worker.serving.delivery import Delivery
from streamtrain_worker.serving.scoring import Scorer
from streamtrain_worker.serving.server import Server, run_http
from streamtrain_worker.serving.tables import VersionedTable
from streamtrain_worker.serving.versions import Guard

from .conftest import free_port


class Stack:
    def __init__(
        self,
        root: Path,
        table: VersionedTable,
        guard: Guard | None = None,
        *,
        deliver: bool = True,
        poll_seconds: float = 0.05,
    ) -> None:
        self.root = root
        self.table = table
        delivery = Delivery(str(root), table, guard, grace_seconds=1.0) if deliver else None
        self.server = Server("ctr", Scorer(str(root), table), delivery, poll_seconds=poll_seconds)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc, grpc_port = self.server.grpc_server("127.0.0.1:0")
        self.grpc.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.stub = serving_pb2_grpc.InferenceStub(self.channel)
        self._loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._runner = self._loop.run_until_complete(
                run_http(self.server.app(), "127.0.0.1", self.port)
            )
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        started.wait(10)
        self.server.start_background()

    def stop(self) -> None:
        self.server.stop()
        self.grpc.stop(0)
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        data = (
            None
            if body is None
            else (body if isinstance(body, bytes) else json.dumps(body).encode())
        )
        req = urllib.request.Request(self.url + path, data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def infer(self, rows: list[str]) -> tuple[int, dict[str, Any]]:
        body = {
            "inputs": [{"name": "rows", "datatype": "BYTES", "shape": [len(rows)], "data": rows}]
        }
        return self.call("POST", "/v2/models/ctr/infer", body)

    def wait_served(self, key: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            current = self.server.scorer.current
            if current is not None and current.version.key == key:
                return
            time.sleep(0.02)
        current = self.server.scorer.current
        raise AssertionError(
            f"{key} not served; serving {current.version.key if current else None}"
        )


def expected_scores(root: Path, key: str, text: str, tmp: Path) -> list[float]:
    """``streamtrain predict``'s per-row scores of ``text`` with model ``key``."""
    path = tmp / f"rows-{key.replace('/', '-')}.txt"
    path.write_text(text)
    model = load_model(str(root), key)
    out = io.StringIO()
    score(model, [str(path)], 1024, RowWriter(out, "jsonl", model.key))
    return [json.loads(x)["score"] for x in out.getvalue().splitlines()]
