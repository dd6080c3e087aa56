"""``streamtrain run``: one job on this machine, from start to a terminal phase or a signal.

Starts the job's processes (``cluster``), connects to them, runs the driver with progress in
a local state file and a live terminal report (``reporting``), restarts children that die
(the driver restores after a PS restart), and on SIGINT/SIGTERM stops after saving progress,
so the same command resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from streamtrain_operator.job.messages import Action
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import Job
from streamtrain_operator.local import monitoring
from streamtrain_operator.local.cluster import LocalCluster
from streamtrain_operator.local.passlog import FILE_NAME, PassLog
from streamtrain_operator.local.reporting import ProgressPrinter
from streamtrain_operator.run.connection import GrpcConnection
from streamtrain_operator.run.driver import Driver, Observer
from streamtrain_operator.run.hooks import NO_HOOK, StepHook
from streamtrain_operator.run.state import LocalStateFile

#: Where a local run's processes listen (gRPC and metrics): this machine only.
HOST = "127.0.0.1"


@dataclass(frozen=True)
class RunOptions:
    """How ``streamtrain run`` runs one job locally."""

    state_path: Path
    workdir: Path
    #: Where the progress goes; None: ``sys.stdout`` when the run starts (not at import).
    out: TextIO | None = None
    start_timeout: float = 120.0
    #: Given to the driver (``run.hooks``): the fault tests hold a run at a step with it.
    step_hook: StepHook = NO_HOOK
    #: Called with every action the driver is about to run, after the progress printer
    #: (benchmarks time the steps with it).
    on_action: Callable[[Action, Progress], None] | None = None
    #: The per-pass metrics file (``passlog``); default ``<workdir>/metrics.csv``.
    metrics_file: Path | None = None
    #: The port the caller serves the run's Prometheus series on (``monitoring``): the PS
    #: shards and workers serve theirs on the ports after it, and ``<workdir>/prometheus.yml``
    #: scrapes them all. None: no metrics endpoints.
    metrics_port: int | None = None
    #: Called with every saved progress record, after the printer (the caller's metrics).
    on_progress: Callable[[Progress], None] | None = None
    #: ``(phase, seconds)``: the start-up's ``launch`` (processes started and listening) and
    #: ``connect``, the driver's (``Observer.on_phase``), and the final ``shutdown``.
    on_phase: Callable[[str, float], None] | None = None


def _chain(
    first: Callable[[Action, Progress], None], then: Callable[[Action, Progress], None] | None
) -> Callable[[Action, Progress], None]:
    if then is None:
        return first

    def both(action: Action, progress: Progress) -> None:
        first(action, progress)
        then(action, progress)

    return both


async def _monitor(cluster: LocalCluster, printer: ProgressPrinter, every: float = 1.0) -> None:
    """Restart dead children promptly, so clients retrying against them find them back."""
    while True:
        await asyncio.sleep(every)
        for what in await cluster.heal():
            printer.line(f"  {what}")


def _announce_metrics(
    job: Job, cluster: LocalCluster, options: RunOptions, printer: ProgressPrinter
) -> None:
    assert options.metrics_port is not None
    targets = cluster.metrics_targets()
    config = monitoring.scrape_config(job, HOST, options.metrics_port, targets)
    path = monitoring.write_scrape_config(options.workdir / monitoring.FILE_NAME, config)
    ports = [port for _, _, port in targets]
    printer.line(
        f"{job.name}: Prometheus metrics on http://{HOST}:{options.metrics_port}/metrics "
        f"(the job) and ports {min(ports)}-{max(ports)} (PS shards, workers); "
        f"scrape config: {path}"
    )


def kernels_cached() -> bool:
    """Whether numba's on-disk cache holds the PS kernels (``make install`` fills it; a
    cold cache makes the first pass compile them, tens of seconds)."""
    import streamtrain_ps

    where = os.environ.get("NUMBA_CACHE_DIR")
    root = Path(where) if where else Path(streamtrain_ps.__file__).parent / "__pycache__"
    return next(root.rglob("*.nbi"), None) is not None


#: Said at the start of a run whose kernels are not cached yet.
COLD_CACHE = (
    "  the numba kernels are not cached yet: the first pass compiles them, once (tens of "
    "seconds); `python -m streamtrain_tools.warm_cache` does it ahead (`make install` does)"
)


async def run_job(job: Job, options: RunOptions) -> Progress:
    """Start the processes, run the scheduler to the end (or a signal), stop everything."""
    out = options.out or sys.stdout
    store = LocalStateFile(options.state_path)
    printer = ProgressPrinter(job, out)
    previous = store.load()
    finished = previous is not None and previous.phase == Phase.SUCCEEDED
    if previous is not None and finished and printer.plan.next_step(previous.completed) is None:
        printer.line(f"{job.name}: already {previous.phase} ({previous.message})")
        return previous
    cluster = LocalCluster(
        job,
        options.workdir,
        start_timeout=options.start_timeout,
        metrics_port=None if options.metrics_port is None else options.metrics_port + 1,
    )
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stopping: list[str] = []

    def on_signal(signum: int) -> None:
        stopping.append(signal.Signals(signum).name)
        if task is not None:
            task.cancel()

    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, on_signal, s)
    conn: GrpcConnection | None = None
    passlog = PassLog(options.metrics_file or options.workdir / FILE_NAME)
    passlog.on_progress(previous or Progress())

    def on_progress(progress: Progress) -> None:
        printer.on_progress(progress)
        passlog.on_progress(progress)
        if options.on_progress is not None:
            options.on_progress(progress)

    try:
        printer.line(
            f"{job.name}: starting {job.spec.ps.replicas} PS shard(s) and "
            f"{job.spec.workers.replicas} worker(s) (logs in {options.workdir / 'logs'})"
        )
        if not kernels_cached():
            printer.line(COLD_CACHE)
        started = time.perf_counter()
        cluster.start()
        launched = time.perf_counter()
        if options.metrics_port is not None:
            _announce_metrics(job, cluster, options, printer)
        conn = await cluster.connect(options.start_timeout)
        if options.on_phase is not None:
            options.on_phase("launch", launched - started)
            options.on_phase("connect", time.perf_counter() - launched)
        driver = Driver(
            job.spec,
            conn.ps,
            conn.workers,
            store,
            observer=Observer(
                on_action=_chain(printer.on_action, options.on_action),
                on_progress=on_progress,
                on_restart=lambda what: printer.line(f"  {what}"),
                on_phase=options.on_phase,
            ),
            restarts=cluster,
            step_hook=options.step_hook,
        )
        monitor = asyncio.create_task(_monitor(cluster, printer))
        try:
            progress = await driver.run()
        finally:
            monitor.cancel()
        passlog.flush()
        printer.finish(progress)
        printer.line(f"{job.name}: per-pass metrics in {passlog.path}")
        return progress
    except asyncio.CancelledError:
        progress = store.load() or Progress()
        printer.line(
            f"{job.name}: stopped by {', '.join(stopping) or 'cancel'}; progress saved in "
            f"{options.state_path} (run again to resume)"
        )
        return progress
    finally:
        passlog.flush()
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(s)
        stopping_at = time.perf_counter()
        if conn is not None:
            await conn.close()
        cluster.stop()
        if options.on_phase is not None:
            options.on_phase("shutdown", time.perf_counter() - stopping_at)
