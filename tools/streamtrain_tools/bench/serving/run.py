"""``python -m streamtrain_tools.bench.serving --json`` (``make bench-serving``): freshness,
delta apply, latency, exactness and memory of the online predictor.

Sized for a 2-core machine shared with other work; every phase runs its own processes and a
``redis-server`` of its own (free loopback port, a temporary directory):

1. **delta apply + publication to served**: an export (``bench.serving.models``: the real
   writers, embedxDim 8) with a base of ``--base-keys`` keys, then ``--passes`` deltas of
   ``--delta-keys`` changed keys each (plus 1% tombstones and 1% new keys); a server (the
   in-process ``Server``) delivering into Redis, then into the embedded table, notes when
   each version starts being served. ``publish_to_served`` = that moment minus the donefile
   line's ``publishedAt``; ``delta_apply_seconds_per_100k_*`` = the delivery's time per
   version (verify, read, write, commit) per 100k keys.
2. **latency**: ``streamtrain serve`` (its own process, rows from Redis) and ``streamtrain
   deliver`` (another process); an open-loop client at ``--rate`` requests/s of batch 1 (and
   ``rate / 10`` of batch 100), latency counted from each request's scheduled time; then the
   same while deltas changing every requested key are published, and while a PyTorch
   training loop runs beside it. Every response is checked: its scores must equal
   ``streamtrain predict``'s for the version it names (``served_vs_predict_max_abs``), and a
   response matching no single version counts as torn.
3. **freshness on a job**: ``streamtrain run`` on a synthetic stream whose folders'
   donefiles arrive one every ``--folder-seconds`` (a minute in production; shorter here),
   one pass per folder and a delta per pass, with the embedded server following the export;
   ``donefile_to_served`` = first response scored by the delta of a folder's pass minus the
   folder's donefile time; ``pass_train_seconds`` = the delta's ``publishedAt`` minus the
   moment the pass could start (its donefile, or the previous delta's publication).

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import redis
import torch
import yaml

from streamtrain_ps.plumbing.launch import free_port
from streamtrain_tools.bench.serving.models import Export, keys_of, lines, rows_for
from streamtrain_worker.publishing.model_folder import ModelKind
from streamtrain_worker.publishing.predict import RowWriter, load_model, score
from streamtrain_worker.serving.delivery import Applied, Delivery
from streamtrain_worker.serving.scoring import Scorer
from streamtrain_worker.serving.server import Server
from streamtrain_worker.serving.tables import EmbeddedTable, RedisTable, VersionedTable

torch.set_num_threads(1)  # the in-process servers score small batches (docs/serving.md)

DAY = "20261101"
DIM = 8
NO_DISK = ("--save", "", "--appendonly", "no")
STATE = ("--state", "state.json")
REQUEST_IDS = 100  # rows of ids 0..99; every delta of phase 2 changes all their keys


@dataclass(frozen=True)
class Settings:
    base_keys: int = 200_000
    delta_keys: int = 100_000
    passes: int = 30
    rate: float = 200.0
    seconds: float = 8.0
    folders: int = 30
    folder_seconds: float = 6.0


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), *NO_DISK],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(500):
        try:
            client.ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.02)
    raise RuntimeError("redis-server did not start")


def pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


# -- 1. delta apply and publication to served ---------------------------------------------


def key_space(s: Settings) -> npt.NDArray[np.uint64]:
    """The request ids' keys first, then random keys up to ``base_keys``."""
    head = keys_of(range(REQUEST_IDS))
    rng = np.random.default_rng(7)
    rest = rng.integers(1, 2**63, s.base_keys - head.shape[0], dtype=np.uint64)
    return np.concatenate([head, rest])


def publish_delta(ex: Export, keys: npt.NDArray[np.uint64], p: int, s: Settings) -> str:
    rng = np.random.default_rng(p)
    n_req = REQUEST_IDS * 3
    changed = np.concatenate(
        [keys[:n_req], rng.choice(keys[n_req:], s.delta_keys - n_req, replace=False)]
    )
    new = rng.integers(1, 2**63, s.delta_keys // 100, dtype=np.uint64)
    tomb = rng.choice(keys[n_req:], s.delta_keys // 100, replace=False)
    delta = np.concatenate([changed, new])
    values = rows_for(delta, 1000 + p, DIM)
    return ex.publish(ModelKind.DELTA, DAY, p, delta, values, tomb, base=f"{DAY}/base", metrics={})


class Watch:
    """Notes when each model key starts being served by ``scorer``."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        self.first: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            current = self.scorer.current
            if current is not None and current.version.key not in self.first:
                self.first[current.version.key] = time.time()
            time.sleep(0.002)

    def wait(self, key: str, timeout: float = 120) -> float:
        deadline = time.monotonic() + timeout
        while key not in self.first:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{key} never served")
            time.sleep(0.005)
        return self.first[key]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def freshness(root: Path, table: VersionedTable, s: Settings, passes: int) -> dict[str, Any]:
    ex = Export(root, dim=DIM)
    keys = key_space(s)
    base = ex.publish(ModelKind.BASE, DAY, 0, keys, rows_for(keys, 1, DIM), metrics={})
    applied: list[Applied] = []
    delivery = Delivery(str(root), table, grace_seconds=1.0)
    server = Server("bench", Scorer(str(root), table), delivery, poll_seconds=0.02)
    server.on_applied = applied.append
    watch = Watch(server.scorer)
    server.start_background()
    try:
        watch.wait(base)
        lags = []
        for p in range(1, passes + 1):
            key = publish_delta(ex, keys, p, s)
            published = json.loads((root / "donefile.txt").read_text().splitlines()[-1])
            lags.append(watch.wait(key) - published["publishedAt"])
    finally:
        watch.stop()
        server.stop()
    per_100k = [
        a.seconds * 100_000 / (s.delta_keys + s.delta_keys // 50)
        for a in applied
        if a.line.kind is ModelKind.DELTA
    ]
    return {
        "publish_to_served_p50_s": pct(lags, 50),
        "publish_to_served_p99_s": pct(lags, 99),
        "delta_apply_seconds_per_100k": pct(per_100k, 50),
        "base_apply_seconds": next(a.seconds for a in applied if a.line.kind is ModelKind.BASE),
        "passes": len(lags),
    }


def redis_memory(url: str, prefix: str) -> dict[str, Any]:
    """Bytes per row of the served version's buckets (MEMORY USAGE) and of the whole DB."""
    client = redis.Redis.from_url(url)
    table = RedisTable(client, prefix)
    used, rows = table.served_memory(table.state().served, 3 + DIM)
    raw = 8 + 4 * (3 + DIM)
    info = client.info("memory")
    return {
        "redis_bytes_per_key": used / rows,
        "redis_bytes_per_key_ratio": used / rows / raw,
        "row_raw_bytes": raw,
        "redis_used_memory_per_served_key": int(info["used_memory"]) / rows,
        "served_keys": rows,
    }


# -- 2. latency, exactness, torn responses -------------------------------------------------


class Client:
    """Open-loop requests at a fixed rate; latency from each request's scheduled time."""

    def __init__(self, port: int, rows: list[str], batch: int) -> None:
        self.port, self.batch = port, batch
        self.body = json.dumps(
            {
                "inputs": [
                    {"name": "rows", "datatype": "BYTES", "shape": [batch], "data": rows[:batch]}
                ]
            }
        ).encode()
        self.latencies: list[float] = []
        self.responses: list[tuple[str, list[float]]] = []
        self.errors = 0

    def run(self, rate: float, seconds: float, threads: int = 4) -> None:
        interval = 1.0 / rate
        start = time.perf_counter() + 0.05
        total = int(rate * seconds)
        lock = threading.Lock()
        counter = iter(range(total))

        def worker() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    break
                scheduled = start + i * interval
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                try:
                    conn.request(
                        "POST",
                        "/v2/models/bench/infer",
                        self.body,
                        {"Content-Type": "application/json"},
                    )
                    resp = conn.getresponse()
                    data = resp.read()
                except OSError:  # a timeout: counted, and a new connection
                    with lock:
                        self.errors += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                    continue
                done = time.perf_counter()
                with lock:
                    if resp.status != 200:
                        self.errors += 1
                        continue
                    self.latencies.append(done - scheduled)
                    body = json.loads(data)
                    self.responses.append((body["model_version"], body["outputs"][0]["data"]))
            conn.close()

        ts = [threading.Thread(target=worker) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    def summary(self) -> dict[str, Any]:
        ms = [x * 1000 for x in self.latencies]
        return {
            "p50_ms": pct(ms, 50),
            "p99_ms": pct(ms, 99),
            "requests": len(ms),
            "errors": self.errors,
        }


TRAINING_LOOP = """
import time, torch
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
opt = torch.optim.Adam(net.parameters())
x = torch.randn(1024, 256); y = torch.rand(1024, 1)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    opt.zero_grad(); loss = torch.nn.functional.mse_loss(net(x), y); loss.backward(); opt.step()
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_http(port: int, key: str | None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/v2/models/bench")
            body = json.loads(conn.getresponse().read())
            served = body["parameters"]["served"]
            if served and (key is None or served["key"] == key):
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"server never served {key}")


def publish_until(root: str, s: Settings, port: int, stop: Any, first: Any) -> None:
    """Publish the next delta once the last is served (one is always being applied) until
    ``stop`` is set, ``first`` once the first is published; runs in its own process."""
    ex = Export(Path(root), dim=DIM)
    keys = key_space(s)
    p = 1
    while not stop.is_set():
        key = publish_delta(ex, keys, p, s)
        first.set()
        p += 1
        try:
            wait_http(port, key, timeout=120)
        except TimeoutError:
            return


def latency(tmp: Path, url: str, s: Settings) -> dict[str, Any]:
    root = tmp / "latency-export"
    redis.Redis.from_url(url).flushdb()  # phase 1's tables out of the memory figures
    ex = Export(root, dim=DIM)
    keys = key_space(s)
    ex.publish(ModelKind.BASE, DAY, 0, keys, rows_for(keys, 1, DIM), metrics={})
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    common = ["--export", str(root), "--redis", url, "--prefix", "lat:"]
    deliver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamtrain_worker.serving",
            "deliver",
            *common,
            "--max-auc-drop",
            "-1",
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamtrain_worker.serving",
            "serve",
            *common,
            "--name",
            "bench",
            "--http-port",
            str(port),
            "--grpc-port",
            "0",
            "--host",
            "127.0.0.1",
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    rows = lines(list(range(REQUEST_IDS))).splitlines()
    out: dict[str, Any] = {}
    seen: list[tuple[str, list[float]]] = []
    try:
        wait_http(port, f"{DAY}/base")
        for batch in (1, 100):  # warm-up: parser and network compiled, connections open
            Client(port, rows, batch).run(20, 1.0)
        for name, batch, rate in (("batch1", 1, s.rate), ("batch100", 100, s.rate / 10)):
            c = Client(port, rows, batch)
            used = cpu_seconds(serve.pid)
            c.run(rate, s.seconds)
            out[name] = c.summary()
            # The server's CPU per request: what the box's load does not change (much).
            out[name]["server_cpu_ms_per_request"] = (
                (cpu_seconds(serve.pid) - used) * 1000 / max(1, len(c.latencies))
            )
            seen += c.responses
        # While deltas changing every requested key are applied: written by another process,
        # so that writing 100k-row parts does not hold this client's GIL (that had delayed
        # requests past their scheduled time and counted the delay as server latency).
        spawn = multiprocessing.get_context("spawn")
        stop, first = spawn.Event(), spawn.Event()
        t = spawn.Process(target=publish_until, args=(str(root), s, port, stop, first), daemon=True)
        t.start()
        first.wait(300)  # its start-up (imports) is not a phase of the measure
        c = Client(port, rows, 1)
        c.run(s.rate, s.seconds)
        c100 = Client(port, rows, 100)
        c100.run(s.rate / 10, s.seconds)
        stop.set()
        t.join(180)
        published = (root / "donefile.txt").read_text().splitlines()[1:]
        out["batch1_with_delta"] = c.summary()
        out["batch100_with_delta"] = c100.summary()
        seen += c.responses + c100.responses
        # With training beside it.
        trainer = subprocess.Popen([sys.executable, "-c", TRAINING_LOOP, str(s.seconds + 5)])
        time.sleep(2)
        c = Client(port, rows, 1)
        c.run(s.rate, s.seconds)
        out["batch1_with_training"] = c.summary()
        trainer.wait()
        seen += c.responses
        out["delta_versions_during_load"] = len(published)
    finally:
        for proc in (serve, deliver):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    out.update(exactness(root, rows, seen, tmp))
    out["memory"] = redis_memory(url, "lat:")
    return out


def exactness(
    root: Path, rows: list[str], seen: list[tuple[str, list[float]]], tmp: Path
) -> dict[str, Any]:
    """Each response against ``streamtrain predict`` of every version seen."""
    data = tmp / "rows.txt"
    data.write_text("\n".join(rows) + "\n")
    expected: dict[str, npt.NDArray[np.float64]] = {}
    for key in sorted({k for k, _ in seen}):
        model = load_model(str(root), key)
        buffer = __import__("io").StringIO()
        score(model, [str(data)], 1024, RowWriter(buffer, "jsonl", key))
        expected[key] = np.array([json.loads(x)["score"] for x in buffer.getvalue().splitlines()])
    worst = 0.0
    torn = 0
    for key, scores in seen:
        got = np.array(scores)
        diff = float(np.max(np.abs(got - expected[key][: got.shape[0]])))
        worst = max(worst, diff)
        if diff > 1e-6 and not any(
            float(np.max(np.abs(got - e[: got.shape[0]]))) <= 1e-6 for e in expected.values()
        ):
            torn += 1
    return {
        "served_vs_predict_max_abs": worst,
        "torn_responses": torn,
        "responses_checked": len(seen),
        "versions_checked": len(expected),
    }


# -- 3. freshness on a job -----------------------------------------------------------------


def job_freshness(tmp: Path, s: Settings) -> dict[str, Any]:
    from streamtrain_worker.data.synth import (
        SEQUENCE_SLOT,
        SLOTS,
        DonefileWriter,
        SynthConfig,
        generate_delayed,
    )

    root = tmp / "job"
    root.mkdir()
    minutes = 1440 // s.folders
    spec = {
        "apiVersion": "streamtrain.io/v1alpha1",
        "kind": "StreamingTrainingJob",
        "metadata": {"name": "fresh"},
        "spec": {
            "data": {
                "path": "data",
                "format": "slot",
                "slots": list(SLOTS),
                "labelSlot": "click",
                "sequenceSlot": SEQUENCE_SLOT,
                "startDay": DAY,
                "endDay": DAY,
                "splitIntervalMinutes": minutes,
                "splitsPerPass": 1,
                "pollSeconds": 0.2,
            },
            "model": {"type": "slot_dnn", "hiddenUnits": [64, 32], "batchSize": 256},
            "ps": {"replicas": 1, "logicalShards": 8},
            "workers": {"replicas": 1},
            "checkpoint": {"path": "checkpoints", "everyPasses": 10},
            "export": {"path": "models", "deltaEveryPasses": 1},
        },
    }
    (root / "job.yaml").write_text(yaml.safe_dump(spec))
    cfg = SynthConfig(
        out=str(root / "data"),
        days=1,
        start=DAY,
        split_interval_minutes=minutes,
        splits_per_pass=1,
        rows_per_folder=2000,
        files_per_folder=1,
        seed=3,
    )
    # The data now, the donefiles once the job waits for them (its start-up not counted).
    synth, held = generate_delayed(cfg, 1e9)
    held.stop()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    job = subprocess.Popen(
        [sys.executable, "-m", "streamtrain_operator.cli", "run", "job.yaml", *STATE],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.poll() is None:
        state = root / "state.json"
        if state.exists() and '"WaitingForData"' in state.read_text():
            break
        time.sleep(0.2)
    writer = DonefileWriter(synth.folders, cfg.donefile, s.folder_seconds).start()
    export = root / "models"
    export.mkdir(exist_ok=True)
    table = EmbeddedTable()
    server = Server(
        "bench",
        Scorer(str(export), table),
        Delivery(str(export), table, grace_seconds=1.0),
        poll_seconds=0.05,
    )
    server.start_background()
    part = next(Path(synth.folders[0]).glob("part-*"))
    row = part.read_text().splitlines()[0].strip()
    first: dict[int, float] = {}
    try:
        deadline = time.monotonic() + s.folders * s.folder_seconds * 4 + 300
        while len(first) < s.folders and time.monotonic() < deadline and job.poll() is None:
            try:
                scored = server.infer([row], None)
                p = (
                    int(scored.version.key.rsplit("-", 1)[1])
                    if "delta" in scored.version.key
                    else 0
                )
                for q in range(1, p + 1):
                    first.setdefault(q, time.time())
            except Exception:
                pass
            time.sleep(0.05)
    finally:
        server.stop()
        writer.stop()
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            job.kill()
    donefile_at = {
        i + 1: (Path(f) / "_SUCCESS").stat().st_mtime
        for i, f in enumerate(synth.folders)
        if (Path(f) / "_SUCCESS").exists()
    }
    published = {}
    for text in (export / "donefile.txt").read_text().splitlines():
        d = json.loads(text)
        if d["kind"] == "delta":
            published[int(d["pass"])] = float(d["publishedAt"])
    to_served = [first[p] - donefile_at[p] for p in first if p in donefile_at]
    train = [
        published[p] - max(donefile_at[p], published.get(p - 1, 0.0))
        for p in published
        if p in donefile_at
    ]
    return {
        "donefile_to_served_p50_s": pct(to_served, 50),
        "donefile_to_served_p99_s": pct(to_served, 99),
        "pass_train_seconds_p50": pct(train, 50),
        "pass_train_seconds_p99": pct(train, 99),
        "job_passes_served": len(to_served),
        "folder_seconds": s.folder_seconds,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.bench.serving", description=__doc__.split("\n")[0]
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--base-keys", type=int, default=Settings.base_keys)
    p.add_argument("--delta-keys", type=int, default=Settings.delta_keys)
    p.add_argument("--passes", type=int, default=Settings.passes)
    p.add_argument("--rate", type=float, default=Settings.rate)
    p.add_argument("--seconds", type=float, default=Settings.seconds)
    p.add_argument("--folders", type=int, default=Settings.folders)
    p.add_argument("--folder-seconds", type=float, default=Settings.folder_seconds)
    p.add_argument("--skip-job", action="store_true", help="skip phase 3 (the training job)")
    p.add_argument(
        "--phase",
        choices=("all", "apply", "latency", "job"),
        default="all",
        help="run one phase only (to iterate; the figures of the others are null)",
    )
    a = p.parse_args(argv)
    s = Settings(
        a.base_keys, a.delta_keys, a.passes, a.rate, a.seconds, a.folders, a.folder_seconds
    )
    result: dict[str, Any] = {"cores": os.cpu_count(), "settings": s.__dict__}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        proc, url = start_redis(tmp)
        try:
            if a.phase in ("all", "apply"):
                result.update(apply_phase(tmp, url, s))
            if a.phase in ("all", "latency"):
                result.update(latency_phase(tmp, url, s))
        finally:
            proc.terminate()
            proc.wait(10)
        if a.phase in ("all", "job") and not a.skip_job:
            print(
                f"== a job: {s.folders} folders, a donefile every {s.folder_seconds:g}s", flush=True
            )
            j = job_freshness(tmp, s)
            print(f"   {j}", flush=True)
            result.update(j)
        else:
            result.update(donefile_to_served_p99_s=None, pass_train_seconds_p50=None)
    print(json.dumps(result, sort_keys=True))
    return 0


def apply_phase(tmp: Path, url: str, s: Settings) -> dict[str, Any]:
    what = f"{s.passes} deltas of {s.delta_keys:,} keys on {s.base_keys:,}"
    print(f"== publication to served, {what}", flush=True)
    r = freshness(tmp / "redis-export", RedisTable.connect(url, "fresh:"), s, s.passes)
    print(f"   redis: {r}", flush=True)
    e = freshness(tmp / "embedded-export", EmbeddedTable(), s, s.passes)
    print(f"   embedded: {e}", flush=True)
    return {
        "publish_to_served_p50_s": r["publish_to_served_p50_s"],
        "publish_to_served_p99_s": r["publish_to_served_p99_s"],
        "delta_apply_seconds_per_100k_redis": r["delta_apply_seconds_per_100k"],
        "publish_to_served_p99_s_embedded": e["publish_to_served_p99_s"],
        "delta_apply_seconds_per_100k_embedded": e["delta_apply_seconds_per_100k"],
        "base_apply_seconds_redis": r["base_apply_seconds"],
    }


def latency_phase(tmp: Path, url: str, s: Settings) -> dict[str, Any]:
    print(f"== latency at {s.rate:g} req/s for {s.seconds:g}s per phase", flush=True)
    lat = latency(tmp, url, s)
    print(f"   {lat}", flush=True)
    return dict(
        latency_p50_ms_batch1=lat["batch1"]["p50_ms"],
        latency_p99_ms_batch1=lat["batch1"]["p99_ms"],
        server_cpu_ms_per_request_batch1=lat["batch1"]["server_cpu_ms_per_request"],
        server_cpu_ms_per_request_batch100=lat["batch100"]["server_cpu_ms_per_request"],
        latency_p50_ms_batch100=lat["batch100"]["p50_ms"],
        latency_p99_ms_batch100=lat["batch100"]["p99_ms"],
        latency_p99_ms_batch1_with_delta=lat["batch1_with_delta"]["p99_ms"],
        latency_p99_ms_batch100_with_delta=lat["batch100_with_delta"]["p99_ms"],
        latency_p99_ms_batch1_with_training=lat["batch1_with_training"]["p99_ms"],
        latency_errors=sum(
            lat[k]["errors"] for k in lat if isinstance(lat[k], dict) and "errors" in lat[k]
        ),
        served_vs_predict_max_abs=lat["served_vs_predict_max_abs"],
        torn_responses=lat["torn_responses"],
        responses_checked=lat["responses_checked"],
        redis_bytes_per_key=lat["memory"]["redis_bytes_per_key"],
        redis_bytes_per_key_ratio=lat["memory"]["redis_bytes_per_key_ratio"],
        redis_used_memory_per_served_key=lat["memory"]["redis_used_memory_per_served_key"],
    )


if __name__ == "__main__":
    sys.exit(main())
