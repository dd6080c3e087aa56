"""The worker control server, for real: gRPC on 127.0.0.1:0, a real PS shard server behind
RemotePS, the Criteo sample as data."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamtrain_ps.api import SaveMode
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.errors import WorkingSet
from streamtrain_ps.plumbing.startup import listening_address
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier.memory_limit import MemoryBudget
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.control.refusals import Reason, is_busy, reason_of
from streamtrain_worker.control.service import SERVICE_NAME, WorkerServer, WorkerServicer
from streamtrain_worker.data.reader import PassReader
from streamtrain_worker.metrics import PassMetrics
from streamtrain_worker.models.calibration import (
    CALIBRATION_VECTOR,
    EVIDENCE_VECTOR,
    PERSISTENCE_VECTOR,
)
from streamtrain_worker.models.context_rate import CONTEXT_VECTOR
from streamtrain_worker.proto import worker_pb2, worker_pb2_grpc
from streamtrain_worker.publishing.export import load_dense
from streamtrain_worker.training.embedding import Lookup, prepare

CRITEO = SAMPLES_DIR / "criteo_kaggle_sample_train.txt"
CONFIG = {
    "data": {"format": "criteo", "maxBadLineFraction": 0.01},
    "model": {"hiddenUnits": [16, 8], "batchSize": 128, "denseSyncSteps": 2},
    "metrics": {"numBuckets": 1024},
    "ps": {"config": {"logicalShards": 8}, "maxRetrySeconds": 1.0, "timeoutSeconds": 5.0},
}


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


@dataclass
class Setup:
    config: WorkerConfig
    ps_server: PSServer
    ps: RemotePS
    servicer: WorkerServicer
    server: WorkerServer
    stub: worker_pb2_grpc.WorkerStub
    channel: grpc.Channel


@pytest.fixture
def setup() -> Iterator[Setup]:
    config = WorkerConfig.from_dict(CONFIG)
    ps_server = PSServer(Shard(config.ps.config), config.ps.config)
    ps_server.start()
    retry = RetryPolicy(max_attempts=100, initial_backoff=0.01, max_backoff=0.1, total_seconds=1.0)
    ps = RemotePS([ps_server.address], config.ps.config, retry=retry)
    servicer = WorkerServicer(config, ps)
    server = WorkerServer(servicer)
    server.start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield Setup(
            config, ps_server, ps, servicer, server, worker_pb2_grpc.WorkerStub(channel), channel
        )
    finally:
        channel.close()
        server.close(grace=0)
        ps.close()
        ps_server.close(grace=0)


@pytest.fixture(scope="module")
def chunk(tmp_path_factory: pytest.TempPathFactory) -> str:
    lines = CRITEO.read_text().splitlines(keepends=True)
    assert len(lines) == 7200, f"{CRITEO}: expected the 7,200-row sample"
    path = tmp_path_factory.mktemp("data") / "part-00000"
    path.write_text("".join(lines[:1000]))
    return str(path)


def run_pass(stub: worker_pb2_grpc.WorkerStub, files: list[str], generation: int = 1):  # type: ignore[no-untyped-def]
    request = worker_pb2.RunPassRequest(
        day="20261101", pass_index=1, files=files, generation=generation, train=True
    )
    return stub.RunPass(request, timeout=60)


def test_run_pass_returns_the_pass_sums(setup: Setup, chunk: str) -> None:
    result = run_pass(setup.stub, [chunk], generation=3)
    assert (result.day, result.pass_index, result.generation) == ("20261101", 1, 3)
    assert result.examples == 1000 and result.files_read == 1 and result.bad_lines == 0
    metrics = PassMetrics.from_proto(result)
    assert metrics.num_buckets == 1024
    assert int(metrics.pos.sum()) == int(result.label_sum) > 0
    assert int(metrics.pos.sum() + metrics.neg.sum()) == 1000
    assert 0.3 < metrics.auc < 0.9 and 0 < metrics.loss < 1.5
    assert result.seconds >= result.train_seconds > 0
    assert setup.ps.stats().tables[0].keys > 1000  # the pass trained the PS
    health = health_pb2_grpc.HealthStub(setup.channel)
    for service in ("", SERVICE_NAME):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_libsvm_field_map_names_the_slots_the_model_is_built_with(tmp_path: Path) -> None:
    # The map's 16 fields are the slots; the config alone would have said one.
    lines = (SAMPLES_DIR / "ipinyou_deepctr_train.fm.txt").read_text().splitlines(True)
    part = tmp_path / "part-00000"
    part.write_text("".join(lines[:600]))
    featindex = SAMPLES_DIR / "ipinyou_deepctr_featindex.fm.txt"
    data = {"format": "libsvm", "fieldMap": str(featindex)}
    config = WorkerConfig.from_dict({**CONFIG, "data": data})
    servicer = WorkerServicer(config, LocalPS(config.ps.config))
    server = WorkerServer(servicer)
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            result = run_pass(worker_pb2_grpc.WorkerStub(channel), [str(part)])
        assert result.examples == 600 and result.bad_lines == 0
        assert servicer.trainer.spec.num_slots == 16
    finally:
        server.close(grace=0)


def test_the_hook_after_the_trainer_build_runs_once(setup: Setup, chunk: str) -> None:
    """``after_build`` (the kernels' warm-up in ``__main__``) runs when the first call has
    built the trainer, and only then: not at construction, not for later calls."""
    built: list[bool] = []
    servicer = WorkerServicer(
        setup.config, setup.ps, after_build=lambda: built.append(servicer._trainer is not None)
    )
    assert built == []
    servicer.trainer.sync_dense()
    servicer.trainer.sync_dense()
    assert built == [True]
    servicer.close()


def test_export_dense_equals_the_live_model(setup: Setup, chunk: str, tmp_path: Path) -> None:
    run_pass(setup.stub, [chunk])
    uri = f"file://{tmp_path}/export/20261101-1"
    reply = setup.stub.ExportDense(worker_pb2.ExportDenseRequest(uri=uri), timeout=60)
    assert [Path(f).name for f in reply.files] == ["dense.pt", "dense.json"]
    module, meta = load_dense(uri)
    assert meta["inputs"][0]["shape"] == [-1, 39, 3 + 8]
    # Criteo's 13 integer columns are ordinal: their [value, missing] inputs
    assert meta["inputs"][1]["shape"] == [-1, 13, 2]
    assert meta["ordinalSlots"] == list(range(13))
    assert meta["output"]["activation"] == "sigmoid"
    trainer = setup.servicer.trainer
    with PassReader([chunk], setup.config.data, 64) as reader:
        batch = next(iter(reader))
    prepared = prepare(batch, setup.ps, "embedding", 8, True, tuple(meta["ordinalSlots"]))
    lookup = Lookup(prepared, cvm=True, requires_grad=False)
    model = trainer.model.eval()
    with torch.no_grad():
        expected = torch.sigmoid(model(lookup.pooled, None, None, lookup.ordinal))
        exported = module(lookup.pooled, None, None, lookup.ordinal)
        torch.testing.assert_close(exported, expected, rtol=0, atol=0)
    assert not np.allclose(expected.numpy(), expected.numpy()[0])  # a real, varying model


def test_an_export_from_a_ps_snapshot_is_the_model_of_its_moment_beside_a_pass(
    setup: Setup, chunk: str, tmp_path: Path
) -> None:
    """The driver takes a PS snapshot between two passes and has the dense part exported
    from it while the next pass trains: the export holds the snapshot's parameters and
    summary statistics, not the live ones, and is not refused as busy."""
    trainer = setup.servicer.trainer
    run_pass(setup.stub, [chunk])
    setup.ps.snapshot(SaveMode.DELTA, "pass-1")
    taken = setup.ps.pull_dense(setup.config.dense_name, "pass-1")
    taken_stats = setup.ps.pull_dense(setup.config.summary_name, "pass-1")
    run_pass(setup.stub, [chunk], generation=2)  # the model moves on
    live = trainer._flat_params.numpy().copy()
    assert not np.allclose(live, taken)
    uri = f"file://{tmp_path}/export/20261101-1"
    with setup.servicer._busy:  # a pass in progress: a live export would be refused
        reply = setup.stub.ExportDense(
            worker_pb2.ExportDenseRequest(uri=uri, snapshot_id="pass-1"), timeout=60
        )
    assert [Path(f).name for f in reply.files] == ["dense.pt", "dense.json"]
    module, _ = load_dense(uri)
    exported = {name: p.detach() for name, p in module.named_parameters()}
    flat = torch.cat([t.reshape(-1) for t in exported.values()]).numpy()
    assert np.array_equal(flat, taken)
    buffers = dict(module.named_buffers())
    # the calibration's window, its evidence and persistence, and the context rate's
    # counts: PS vectors of their own
    own_vectors = {
        CONTEXT_VECTOR: buffers.pop("model.context_rate.0.stats"),
        CALIBRATION_VECTOR: buffers.pop("model.calibration.0.stats"),
        EVIDENCE_VECTOR: buffers.pop("model.calibration.0.evidence.0.stats"),
        PERSISTENCE_VECTOR: buffers.pop("model.calibration.0.persistence.0.stats"),
    }
    stats = torch.cat([b.reshape(-1) for n, b in buffers.items() if n.endswith(".stats")])
    assert np.array_equal(stats.numpy(), taken_stats)
    for vector, exported_stats in own_vectors.items():
        taken_vector = setup.ps.pull_dense(setup.config.summary_vector_name(vector), "pass-1")
        assert np.array_equal(exported_stats.numpy(), taken_vector), vector
    assert own_vectors[EVIDENCE_VECTOR][0] == 0.0  # the first pass started from no window
    # the trained network was left alone
    assert np.array_equal(trainer._flat_params.numpy(), live)


class GatedPS:
    """A PSLike that holds every sparse pull until ``gate`` opens (delegates the rest)."""

    def __init__(self, ps: RemotePS) -> None:
        self.ps = ps
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def pull_sparse(self, table: str, keys: np.ndarray) -> np.ndarray:
        self.waiting.set()
        assert self.gate.wait(timeout=60), "test never opened the gate"
        return self.ps.pull_sparse(table, keys)

    def __getattr__(self, name: str) -> object:
        return getattr(self.ps, name)


@dataclass
class GatedWorker:
    """A worker server whose PS pulls wait for ``gated.gate``, with a stub and two threads."""

    gated: GatedPS
    servicer: WorkerServicer
    stub: worker_pb2_grpc.WorkerStub
    pool: ThreadPoolExecutor
    address: str


@contextmanager
def gated_worker(setup: Setup) -> Iterator[GatedWorker]:
    gated = GatedPS(setup.ps)
    servicer = WorkerServicer(setup.config, gated)  # type: ignore[arg-type]
    server = WorkerServer(servicer)
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel, ThreadPoolExecutor(2) as pool:
            stub = worker_pb2_grpc.WorkerStub(channel)
            yield GatedWorker(gated, servicer, stub, pool, server.address)
    finally:
        server.close(grace=0)


async def reset_over_aio(address: str) -> Reason | None:
    """A Reset through ``grpc.aio``, as the driver sends it; the refusal's reason."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await worker_pb2_grpc.WorkerStub(channel).Reset(worker_pb2.ResetRequest(), timeout=30)
        except grpc.aio.AioRpcError as exc:
            return reason_of(exc)
    return None


def test_a_second_concurrent_pass_is_rejected(setup: Setup, chunk: str) -> None:
    with gated_worker(setup) as w:
        first: Future[worker_pb2.PassResult] = w.pool.submit(run_pass, w.stub, [chunk])
        assert w.gated.waiting.wait(timeout=30)  # the first pass is inside its first pull
        with pytest.raises(grpc.RpcError) as err:
            run_pass(w.stub, [chunk])
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(err.value) is Reason.BUSY
        assert "busy" in (err.value.details() or "")  # and says so to people
        assert asyncio.run(reset_over_aio(w.address)) is Reason.BUSY  # the driver's client
        w.gated.gate.set()
        assert first.result(timeout=60).examples == 1000
        assert run_pass(w.stub, [chunk]).examples == 1000  # free again


def test_a_reset_of_a_newer_generation_cancels_an_older_pass(setup: Setup, chunk: str) -> None:
    """A scheduler that took over (generation 2) must not wait out generation 1's pass, and
    once its Reset has answered, generation 1 can no longer push or start a pass."""
    with gated_worker(setup) as w:
        old: Future[worker_pb2.PassResult] = w.pool.submit(run_pass, w.stub, [chunk], 1)
        assert w.gated.waiting.wait(timeout=30)  # generation 1 is inside its first pull
        with pytest.raises(grpc.RpcError) as busy:  # generation 0: no takeover, as before
            w.stub.Reset(worker_pb2.ResetRequest(), timeout=30)
        assert busy.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert is_busy(busy.value)
        reset = w.pool.submit(w.stub.Reset, worker_pb2.ResetRequest(generation=2), timeout=60)
        wait_until(w.servicer._cancel.is_set)
        w.gated.gate.set()
        reset.result(timeout=60)
        assert old.done(), "Reset answered while the old pass could still push"
        with pytest.raises(grpc.RpcError) as cancelled:
            old.result()
        assert cancelled.value.code() is grpc.StatusCode.ABORTED
        assert reason_of(cancelled.value) is Reason.CANCELLED
        assert "cancelled" in (cancelled.value.details() or "")
        assert setup.ps.stats().tables[0].keys == 0  # stopped before its first push
        with pytest.raises(grpc.RpcError) as stale:
            run_pass(w.stub, [chunk], 1)
        assert reason_of(stale.value) is Reason.STALE_GENERATION
        assert "stale generation 1" in (stale.value.details() or "")
        assert run_pass(w.stub, [chunk], 2).examples == 1000


def test_stale_generation_and_bad_data_are_clear_errors(
    setup: Setup, chunk: str, tmp_path: Path
) -> None:
    # A file over the bad-line limit is DATA_LOSS (permanent: the scheduler does not retry
    # it) and none of its examples is trained: its lines are held until its fraction is known.
    bad = tmp_path / "bad-part"
    good = Path(chunk).read_text().splitlines(keepends=True)[:100]
    bad.write_text("".join(good) + "not\ta\tcriteo\tline\n" * 5)
    with pytest.raises(grpc.RpcError) as err:
        run_pass(setup.stub, [str(bad), chunk], generation=5)
    assert err.value.code() is grpc.StatusCode.DATA_LOSS
    assert f"{bad}: 5 bad of 105 lines, first bad lines 101" in (err.value.details() or "")
    assert setup.ps.stats().tables[0].keys == 0  # nothing pushed
    run_pass(setup.stub, [chunk], generation=5)
    with pytest.raises(grpc.RpcError) as err:
        run_pass(setup.stub, [chunk], generation=4)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(err.value) is Reason.STALE_GENERATION
    assert "stale generation 4" in (err.value.details() or "")
    with pytest.raises(grpc.RpcError) as err:
        run_pass(setup.stub, [str(tmp_path / "missing")], generation=5)
    assert err.value.code() is grpc.StatusCode.NOT_FOUND


def test_bad_data_and_a_gone_file_carry_the_reason_the_driver_decides_on(
    setup: Setup, chunk: str, tmp_path: Path
) -> None:
    """The driver ends the job on these (``worker_errors.permanent``) by the typed reason in
    the trailing metadata, not by the status code's name."""
    bad = tmp_path / "bad-part"
    bad.write_text("not\ta\tcriteo\tline\n" * 5)
    with pytest.raises(grpc.RpcError) as err:
        run_pass(setup.stub, [str(bad)], generation=5)
    assert reason_of(err.value) is Reason.BAD_DATA
    with pytest.raises(grpc.RpcError) as err:
        run_pass(setup.stub, [str(tmp_path / "missing")], generation=5)
    assert reason_of(err.value) is Reason.FILE_GONE


def test_a_gone_ps_is_reported_as_unavailable(setup: Setup, chunk: str) -> None:
    run_pass(setup.stub, [chunk])
    setup.ps_server.close(grace=0)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        run_pass(setup.stub, [chunk])
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert setup.ps_server.address in (err.value.details() or "")
    assert time.monotonic() - started < 30
    health = health_pb2_grpc.HealthStub(setup.channel)  # the worker itself stays up
    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_ps_memory_limit_refusal_is_forwarded_with_its_numbers(chunk: str) -> None:
    """A PS whose table budget cannot hold one push of the pass: the worker ends the pass
    with RESOURCE_EXHAUSTED, reason MEMORY_LIMIT and the PS's numbers, as they came."""
    config = WorkerConfig.from_dict(CONFIG)
    ps_config = dataclasses.replace(config.ps.config, memoryLimit=20_000)
    shard = Shard(ps_config, memory_budget=MemoryBudget.tables_only(20_000))
    ps_server = PSServer(shard, ps_config)
    ps_server.start()
    ps = RemotePS([ps_server.address], ps_config, retry=RetryPolicy(max_attempts=1))
    server = WorkerServer(WorkerServicer(config, ps))
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as err:
            run_pass(worker_pb2_grpc.WorkerStub(channel), [chunk])
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason_of(err.value) is Reason.MEMORY_LIMIT
        ws = WorkingSet.from_metadata(err.value.trailing_metadata() or ())
        assert ws is not None and ws.memory_limit == 20_000 and ws.table_budget == 20_000
        assert ws.needed_bytes > 10_000 and ws.keys > 0
        assert "spec.ps.memoryLimit" in (err.value.details() or "")
    finally:
        server.close(grace=0)
        ps.close()
        ps_server.close(grace=0)
        shard.close()


def test_main_prints_its_port_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({**CONFIG, "ps": {**CONFIG["ps"], "endpoints": ["127.0.0.1:1"]}}))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamtrain_worker",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--config",
            str(config),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        address = listening_address(line)
        assert address is not None and address.startswith("127.0.0.1:"), line + (
            proc.stderr.read() if proc.stderr else ""
        )
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        metrics_line = proc.stdout.readline()
        assert metrics_line.startswith("metrics on http://127.0.0.1:"), metrics_line
        with urllib.request.urlopen(metrics_line.split()[-1], timeout=10) as response:
            exposition = response.read().decode()
        assert "streamtrain_worker_examples_total 0.0" in exposition
        assert "streamtrain_worker_ps_pull_seconds_bucket" in exposition
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_config_fails_fast(tmp_path: Path) -> None:
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({**CONFIG, "model": {"type": "nope"}}))
    done = subprocess.run(
        [sys.executable, "-m", "streamtrain_worker", "--port", "0", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "worker.model.type" in done.stderr


def test_a_briefly_unavailable_ps_is_waited_for(chunk: str) -> None:
    """The worker starts before its PS; the first pass retries until the PS comes up."""
    config = WorkerConfig.from_dict(CONFIG)
    shard = Shard(config.ps.config)
    first = PSServer(shard, config.ps.config)
    port = first.start()
    first.close(grace=0)  # a known port with nothing listening
    retried = threading.Event()
    policy = RetryPolicy(
        max_attempts=1000, initial_backoff=0.01, max_backoff=0.05, total_seconds=60
    )
    ps = RemotePS(
        [f"127.0.0.1:{port}"], config.ps.config, retry=policy, on_retry=lambda *_: retried.set()
    )
    server = WorkerServer(WorkerServicer(config, ps))
    server.start()
    ps_server = PSServer(shard, config.ps.config, port=port)
    try:
        with grpc.insecure_channel(server.address) as channel, ThreadPoolExecutor(1) as pool:
            pending = pool.submit(run_pass, worker_pb2_grpc.WorkerStub(channel), [chunk])
            assert retried.wait(timeout=30)  # the pass is retrying against the absent PS
            ps_server.start()
            assert pending.result(timeout=60).examples == 1000
    finally:
        server.close(grace=0)
        ps.close()
        ps_server.close(grace=0)


def test_reset_adopts_the_ps_dense_values(setup: Setup, chunk: str) -> None:
    run_pass(setup.stub, [chunk])
    name = setup.config.dense_name
    values = setup.ps.pull_dense(name)
    setup.ps.push_dense(name, np.ones_like(values))  # e.g. the PS reloaded other values
    changed = setup.ps.pull_dense(name)
    assert not np.array_equal(changed, values)
    setup.stub.Reset(worker_pb2.ResetRequest(), timeout=30)
    model = setup.servicer.trainer.model
    local = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    assert np.array_equal(local, changed)
