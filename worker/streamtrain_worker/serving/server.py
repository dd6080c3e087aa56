"""``streamtrain serve``: KServe v2 HTTP/JSON and a gRPC twin over one ``Scorer``.

HTTP (aiohttp)::

    GET  /v2/health/live | /v2/health/ready       ready: a verified model is served
    GET  /v2/models/<name> | /v2/models/<name>/ready
    POST /v2/models/<name>/infer                  {"inputs": [{"name": "rows" | "columns",
                                                   "datatype": "BYTES", "shape": [n],
                                                   "data": [...]}]}
    GET  /v2/models/<name>/versions               delivery state, refusals
    POST /v2/models/<name>/rollback               pin the accepted version before the served one
    POST /v2/models/<name>/pin  {"version": id}   pin a version (0: follow the live one)
    GET  /metrics                                 Prometheus

A response names the model key and version id that scored all its rows
(``model_version``, ``parameters.version_id``). Bad requests: 400 with the field named.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from streamtrain_worker.proto import serving_pb2, serving_pb2_grpc
from streamtrain_worker.serving.delivery import Applied, Delivery
from streamtrain_worker.serving.scoring import (
    NotReadyError,
    RequestError,
    Scored,
    Scorer,
    describe_version,
)

log = logging.getLogger(__name__)
#: How often the server looks for a new served version (a rollback or a pin takes effect
#: within this, plus loading the network once).
REFRESH_SECONDS = 0.05
#: Requests of at most this many rows are scored on the event loop's thread (well under a
#: millisecond with the bucket cache): no hand-off to a pool thread and back, which on a
#: busy box costs two waits for the scheduler; bigger ones go to the pool.
INLINE_ROWS = 8
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class _StateCollector(Collector):
    """Gauges read from the delivery state at scrape time."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    def collect(self) -> Any:
        state = self.scorer.table.state()
        current = self.scorer.current
        version = GaugeMetricFamily(
            "streamtrain_serving_version", "Version id (donefile line) being served"
        )
        age = GaugeMetricFamily(
            "streamtrain_serving_model_age_seconds", "Now minus the served model's publication"
        )
        lag = GaugeMetricFamily(
            "streamtrain_serving_delivery_lag_seconds",
            "Publication to delivery of the newest built version",
        )
        refused = CounterMetricFamily(
            "streamtrain_serving_refused_models", "Models the guard kept from going live"
        )
        pinned = GaugeMetricFamily("streamtrain_serving_pinned", "1 while a version is pinned")
        if current is not None:
            version.add_metric([], current.version.id)
            age.add_metric([], time.time() - current.version.published_at)
        if state.head is not None:
            lag.add_metric([], state.head.delivered_at - state.head.published_at)
        refused.add_metric([], state.refused)
        pinned.add_metric([], 1 if state.pinned else 0)
        yield from (version, age, lag, refused, pinned)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.latency = Histogram(
            "streamtrain_serving_request_seconds",
            "Inference request latency",
            ["protocol"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rows = Counter("streamtrain_serving_rows", "Rows scored", registry=self.registry)
        self.missed = Counter(
            "streamtrain_serving_lookups_missed",
            "Sparse keys not in the served table (scored as zeros)",
            registry=self.registry,
        )
        self.errors = Counter(
            "streamtrain_serving_bad_requests", "Requests answered 4xx", registry=self.registry
        )


class Server:
    """One model name served over HTTP and gRPC; optionally delivering in-process."""

    def __init__(
        self,
        name: str,
        scorer: Scorer,
        delivery: Delivery | None = None,
        *,
        poll_seconds: float = 0.2,
        workers: int = 2,
    ) -> None:
        self.name = name
        self.scorer = scorer
        self.delivery = delivery
        self.poll_seconds = poll_seconds
        self.metrics = Metrics()
        self.metrics.registry.register(_StateCollector(scorer))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="score")
        self.on_applied: Callable[[Applied], None] = lambda a: None

    # -- background: delivery and refresh ----------------------------------------------

    def start_background(self) -> None:
        if self.delivery is not None:
            delivery = self.delivery

            def deliver() -> None:
                while not self._stop.is_set():
                    try:
                        for applied in delivery.step(self._stop):
                            self.on_applied(applied)
                        self._refresh()
                    except Exception:
                        log.exception("delivery step failed; retrying")
                    self._stop.wait(self.poll_seconds)

            self._threads.append(threading.Thread(target=deliver, name="deliver", daemon=True))

        def refresh() -> None:
            while not self._stop.is_set():
                self._refresh()
                self._stop.wait(REFRESH_SECONDS)

        self._threads.append(threading.Thread(target=refresh, name="refresh", daemon=True))
        for t in self._threads:
            t.start()

    def _refresh(self) -> None:
        try:
            self.scorer.refresh()
        except Exception:
            log.exception("cannot load the served version; keeping the current one")

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def ready(self) -> bool:
        return self.scorer.current is not None

    # -- the one inference path --------------------------------------------------------

    def infer(self, rows: list[Any] | None, columns: list[Any] | None) -> Scored:
        scored = self.scorer.score(rows, columns)
        self.metrics.rows.inc(scored.scores.shape[0])
        self.metrics.missed.inc(scored.missed)
        return scored

    def response(self, scored: Scored, request_id: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model_name": self.name,
            "model_version": scored.version.key,
            "parameters": {"version_id": scored.version.id},
            "outputs": [
                {
                    "name": "score",
                    "datatype": "FP64",
                    "shape": [int(scored.scores.shape[0])],
                    "data": scored.scores.tolist(),
                }
            ],
        }
        if request_id is not None:
            body["id"] = request_id
        return body

    # -- HTTP ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        model = f"/v2/models/{self.name}"
        app.router.add_get("/v2/health/live", self._live)
        app.router.add_get("/v2/health/ready", self._ready)
        app.router.add_get(model, self._metadata)
        app.router.add_get(f"{model}/ready", self._ready)
        app.router.add_post(f"{model}/infer", self._infer)
        app.router.add_get(f"{model}/versions", self._versions)
        app.router.add_post(f"{model}/rollback", self._rollback)
        app.router.add_post(f"{model}/pin", self._pin)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/v2/models/{name}/{rest:.*}", self._unknown_model)
        app.router.add_route("*", "/v2/models/{name}", self._unknown_model)
        return app

    async def _live(self, _: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def _ready(self, _: web.Request) -> web.Response:
        return web.json_response({"ready": self.ready}, status=200 if self.ready else 503)

    async def _metadata(self, _: web.Request) -> web.Response:
        current = self.scorer.current
        state = self.scorer.table.state()
        return web.json_response(
            {
                "name": self.name,
                "versions": [v.key for v in state.history],
                "platform": "streamtrain",
                "inputs": [
                    {"name": "rows", "datatype": "BYTES", "shape": [-1]},
                    {"name": "columns", "datatype": "BYTES", "shape": [-1]},
                ],
                "outputs": [{"name": "score", "datatype": "FP64", "shape": [-1]}],
                "parameters": {"served": describe_version(current.version) if current else None},
            }
        )

    async def _unknown_model(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return _error(404, f"model {name!r} is not served here (this server serves {self.name!r})")

    async def _infer(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RequestError("body", f"not JSON: {exc}") from None
            rows, columns, request_id = _inputs(body)
            if len(rows if rows is not None else columns or ()) <= INLINE_ROWS:
                scored = self.infer(rows, columns)
            else:
                loop = asyncio.get_running_loop()
                scored = await loop.run_in_executor(self._pool, self.infer, rows, columns)
        except RequestError as exc:
            self.metrics.errors.inc()
            return _error(400, str(exc))
        except NotReadyError as exc:
            return _error(503, str(exc))
        finally:
            self.metrics.latency.labels("http").observe(time.perf_counter() - started)
        return web.json_response(self.response(scored, request_id))

    async def _versions(self, _: web.Request) -> web.Response:
        state = self.scorer.table.state()
        refusals = self.delivery.refusals if self.delivery is not None else []
        return web.json_response(
            {
                "served": state.served,
                "live": state.live,
                "pinned": state.pinned,
                "cursor": state.cursor,
                "refused": state.refused,
                "head": describe_version(state.head) if state.head else None,
                "history": [describe_version(v) for v in state.history],
                "refusals": [
                    {"key": r.key, "reason": r.reason, "at": r.at} for r in refusals[-20:]
                ],
            }
        )

    async def _rollback(self, _: web.Request) -> web.Response:
        return await self._switch(lambda: self.scorer.table.rollback().served)

    async def _pin(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"body: not JSON: {exc}")
        vid = body.get("version") if isinstance(body, dict) else None
        if isinstance(vid, bool) or not isinstance(vid, int) or vid < 0:
            return _error(400, f"version: must be a version id >= 0 (0: unpin), got {vid!r}")
        return await self._switch(lambda: self.scorer.table.pin(vid).served)

    async def _switch(self, change: Callable[[], int]) -> web.Response:
        try:
            served = change()
        except LookupError as exc:
            return _error(409, str(exc.args[0]) if exc.args else str(exc))
        # Effective here at once (other replicas: at their next refresh).
        await asyncio.get_running_loop().run_in_executor(self._pool, self._refresh)
        return web.json_response({"served": served})

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

    # -- gRPC ----------------------------------------------------------------------------

    def grpc_server(self, address: str) -> tuple[grpc.Server, int]:
        server = grpc.server(ThreadPoolExecutor(4, thread_name_prefix="grpc"))
        serving_pb2_grpc.add_InferenceServicer_to_server(_Servicer(self), server)
        port = server.add_insecure_port(address)
        return server, port


class _Servicer(serving_pb2_grpc.InferenceServicer):
    def __init__(self, server: Server) -> None:
        self.server = server

    def ServerReady(  # noqa: N802 -- the proto's name
        self, request: serving_pb2.ServerReadyRequest, context: grpc.ServicerContext
    ) -> serving_pb2.ServerReadyResponse:
        return serving_pb2.ServerReadyResponse(ready=self.server.ready)

    def ModelInfer(  # noqa: N802 -- the proto's name
        self, request: serving_pb2.ModelInferRequest, context: grpc.ServicerContext
    ) -> serving_pb2.ModelInferResponse:
        started = time.perf_counter()
        s = self.server
        try:
            if request.model_name and request.model_name != s.name:
                context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model_name!r} not served")
            columns = None
            if request.columns_json:
                columns = []
                for i, text in enumerate(request.columns_json):
                    try:
                        columns.append(json.loads(text))
                    except json.JSONDecodeError as exc:
                        raise RequestError(f"columns_json[{i}]", f"not JSON: {exc}") from None
            rows = list(request.rows) if request.rows or columns is None else None
            scored = s.infer(rows, columns)
        except RequestError as exc:
            s.metrics.errors.inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except NotReadyError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        finally:
            s.metrics.latency.labels("grpc").observe(time.perf_counter() - started)
        return serving_pb2.ModelInferResponse(
            model_name=s.name,
            model_version=scored.version.key,
            version_id=scored.version.id,
            id=request.id,
            scores=scored.scores.tolist(),
        )


def _inputs(body: Any) -> tuple[list[Any] | None, list[Any] | None, str | None]:
    """``rows`` or ``columns`` of a KServe v2 infer request."""
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError("id", "must be a string")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("inputs", "must be a non-empty list")
    found: dict[str, list[Any]] = {}
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise RequestError(f"inputs[{i}]", "must be an object")
        name = tensor.get("name")
        if name not in ("rows", "columns"):
            raise RequestError(f"inputs[{i}].name", f"must be 'rows' or 'columns', got {name!r}")
        data = tensor.get("data")
        if not isinstance(data, list):
            raise RequestError(f"inputs[{i}].data", "must be a list")
        shape = tensor.get("shape")
        if shape is not None and shape != [len(data)]:
            raise RequestError(f"inputs[{i}].shape", f"{shape!r} does not match {len(data)} rows")
        found[name] = data
    return found.get("rows"), found.get("columns"), request_id


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def run_http(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def show_one_request(
    export: str, data_file: str | os.PathLike[str], out: Any, rows: int = 2
) -> dict[str, Any]:
    """Serve the newest model of ``export`` over HTTP on a free port, send one KServe v2
    request with the first ``rows`` lines of ``data_file``, print both, stop (``make demo``)."""
    import socket
    import urllib.request

    from streamtrain_worker.serving.tables import EmbeddedTable

    table = EmbeddedTable()
    delivery = Delivery(export, table)
    delivery.step()
    server = Server("demo", Scorer(export, table), delivery)
    server.scorer.refresh()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(run_http(server.app(), "127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with open(data_file) as f:
            lines = [f.readline().strip() for _ in range(rows)]
        body = {"inputs": [{"name": "rows", "datatype": "BYTES", "shape": [rows], "data": lines}]}
        url = f"http://127.0.0.1:{port}/v2/models/demo/infer"
        print(f"\n== serving: streamtrain serve --export {export}", file=out)
        print(f"   POST {url}\n   {json.dumps(body)[:300]}", file=out)
        req = urllib.request.Request(
            url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        print(f"   -> {json.dumps(answer)}", file=out)
        return answer
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        server.stop()
