"""Local mode: the job's PS shards and workers as child processes of ``streamtrain run``.

Each child is started with ``--port 0`` on 127.0.0.1 and announces its bound address on its
first output line (``listening on HOST:PORT``); everything else it prints goes to
``<workdir>/logs/<name>.log``. Children are tied to this process three ways, so none
outlives it: a normal exit stops them (SIGTERM, then SIGKILL after a grace period), a signal
or an exception runs the same ``finally``, and on Linux each child has ``PR_SET_PDEATHSIG``
so even a SIGKILLed ``streamtrain run`` takes its children with it. The death signal is set
by a two-line prelude in the child's own fresh interpreter, which then ``exec``s the real
command (the setting survives ``execve``): no ``preexec_fn``, which is unsafe to run after
``fork`` in a process with gRPC threads.

A child that dies while the job runs is restarted on its old port (``heal``), so clients
reconnect by address; a PS restart comes back empty, which the driver turns into a reload of
the last checkpoint and a replay (``Scheduler.restore``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from streamtrain_operator.job import render
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.scheduler import Action
from streamtrain_operator.job.spec import Job
from streamtrain_operator.local.reporting import ProgressPrinter
from streamtrain_operator.run.driver import Driver, Observer
from streamtrain_operator.run.state import LocalStateFile
from streamtrain_operator.run.worker_client import GrpcWorker
from streamtrain_ps.errors import PSUnavailableError
from streamtrain_ps.remote import RemotePS

LISTENING = re.compile(r"listening on (\S+:\d+)")
PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """A child process did not start (its log file is named in the message)."""


#: Run by ``python -c`` in the child: die with the parent, then become the real command.
_PRELUDE = (
    "import ctypes, ctypes.util, os, sys\n"
    "libc = ctypes.util.find_library('c')\n"
    f"if libc: ctypes.CDLL(libc).prctl({PR_SET_PDEATHSIG}, {int(signal.SIGKILL)})\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)  # the parent died before prctl\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


@dataclass
class Child:
    name: str
    role: str  # "ps" | "worker"
    args: tuple[str, ...]  # after the interpreter; "--port 0" until the first start
    process: subprocess.Popen[str]
    log_path: Path
    address: str = ""
    #: The port it listens on (kept across restarts: clients know the address).
    port: str = "0"
    _drain: threading.Thread | None = field(default=None, repr=False)


class LocalCluster:
    """Starts and stops the PS shards and workers of one job on this machine."""

    def __init__(
        self,
        job: Job,
        workdir: Path,
        python: str = sys.executable,
        start_timeout: float = 120.0,
        ps_route: Callable[[str], str] | None = None,
    ) -> None:
        self.job = job
        #: Maps a PS endpoint to the address the workers dial (tests put a fault-injecting
        #: proxy between workers and PS; the driver always dials the PS directly).
        self.ps_route = ps_route or (lambda endpoint: endpoint)
        self.workdir = workdir
        self.python = python
        self.start_timeout = start_timeout
        self.children: list[Child] = []
        #: Restarts so far; a PS restart means lost model state (the driver restores).
        self.ps_restarts = 0
        self.last_ps_restart = ""
        self.worker_restarts = 0
        self.last_worker_restart = ""
        self._healing = asyncio.Lock()
        self.ps_endpoints: list[str] = []
        self.worker_endpoints: list[str] = []

    def start(self) -> None:
        """Start every PS shard, then every worker (they need the PS endpoints)."""
        spec = self.job.spec
        configs = self.workdir / "configs"
        configs.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        ps_json = configs / "ps.json"
        ps_json.write_text(render.render_ps(spec))
        n = spec.ps.replicas
        shards = [
            self._spawn(
                f"ps-{i}",
                "ps",
                [
                    *("-m", "streamtrain_ps", "--port", "0", "--config", str(ps_json)),
                    *("--shard-index", str(i), "--num-shards", str(n)),
                ],
            )
            for i in range(n)
        ]
        self.ps_endpoints = [self._await_listening(c) for c in shards]
        worker_json = configs / "worker.json"
        routed = [self.ps_route(endpoint) for endpoint in self.ps_endpoints]
        worker_json.write_text(render.render_worker(spec, routed))
        workers = [
            self._spawn(
                f"worker-{i}",
                "worker",
                [
                    *("-m", "streamtrain_worker", "--port", "0", "--config", str(worker_json)),
                    *("--worker-index", str(i)),
                ],
            )
            for i in range(spec.workers.replicas)
        ]
        self.worker_endpoints = [self._await_listening(c) for c in workers]

    def _spawn(self, name: str, role: str, args: Sequence[str]) -> Child:
        log_path = self.workdir / "logs" / f"{name}.log"
        log_file = log_path.open("a")
        command = [self.python, *args]
        if sys.platform == "linux":
            command = [self.python, "-c", _PRELUDE, str(os.getpid()), *args]
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        log_file.close()
        child = Child(name, role, tuple(args), process, log_path)
        self.children.append(child)
        return child

    async def heal(self) -> list[str]:
        """Restart every child that exited, on its old port (clients reconnect by address).

        Returns what was restarted. Spawning happens on the calling (event loop) thread:
        ``PR_SET_PDEATHSIG`` ties a child to the thread that forked it.
        """
        async with self._healing:
            healed = []
            for old in [c for c in self.children if c.process.poll() is not None]:
                args = list(old.args)
                args[args.index("--port") + 1] = old.port
                self.children.remove(old)
                new = self._spawn(old.name, old.role, args)
                new.port = old.port
                try:
                    await asyncio.to_thread(self._await_listening, new)
                except LaunchError as exc:  # tried again at the next heal
                    healed.append(f"{old.name} could not be restarted: {exc}")
                    continue
                what = (
                    f"{old.name} exited with code {old.process.returncode}; "
                    f"restarted on {new.address}"
                )
                if old.role == "ps":
                    self.ps_restarts += 1
                    self.last_ps_restart = what
                else:
                    self.worker_restarts += 1
                    self.last_worker_restart = what
                healed.append(what)
            return healed

    def _await_listening(self, child: Child) -> str:
        """Read the child's first lines until ``listening on``; then drain the rest to its log."""
        assert child.process.stdout is not None
        stdout = child.process.stdout
        found: list[str] = []
        done = threading.Event()

        def read() -> None:
            with child.log_path.open("a") as log:
                for line in stdout:
                    if not found and (m := LISTENING.search(line)):
                        found.append(m.group(1))
                        done.set()
                    log.write(line)
                    log.flush()
            done.set()

        child._drain = threading.Thread(target=read, name=f"drain-{child.name}", daemon=True)
        child._drain.start()
        if not done.wait(self.start_timeout) or not found:
            code = child.process.poll()
            tail = _tail(child.log_path)
            raise LaunchError(
                f"{child.name} did not start (exit code {code}); see {child.log_path}:\n{tail}"
            )
        child.address = found[0]
        child.port = child.address.rsplit(":", 1)[1]
        return child.address

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every child, wait up to ``grace`` seconds, SIGKILL what is left."""
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children:
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            if child._drain is not None:
                child._drain.join(timeout=5)
        self.children.clear()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class RunOptions:
    """How ``streamtrain run`` runs one job locally."""

    state_path: Path
    workdir: Path
    out: TextIO = sys.stdout
    start_timeout: float = 120.0
    #: Called with every action the driver is about to run, after the progress printer
    #: (benchmarks time the steps with it).
    on_action: Callable[[Action, Progress], None] | None = None


async def connect(
    cluster: LocalCluster, job: Job, timeout: float
) -> tuple[RemotePS, list[GrpcWorker]]:
    ps = RemotePS(cluster.ps_endpoints, render.ps_config(job.spec))
    try:
        await asyncio.to_thread(ps.wait_ready, timeout)
    except PSUnavailableError:
        ps.close()
        raise
    workers = [GrpcWorker(ep, name=f"worker-{i}") for i, ep in enumerate(cluster.worker_endpoints)]
    await asyncio.gather(*(w.wait_ready(timeout) for w in workers))
    return ps, workers


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


async def run_job(job: Job, options: RunOptions) -> Progress:
    """Start the processes, run the scheduler to the end (or a signal), stop everything."""
    out = options.out
    store = LocalStateFile(options.state_path)
    printer = ProgressPrinter(job, out)
    previous = store.load()
    finished = previous is not None and previous.phase == Phase.SUCCEEDED
    if previous is not None and finished and printer.plan.next_step(previous.completed) is None:
        printer.line(f"{job.name}: already {previous.phase} ({previous.message})")
        return previous
    cluster = LocalCluster(job, options.workdir, start_timeout=options.start_timeout)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stopping: list[str] = []

    def on_signal(signum: int) -> None:
        stopping.append(signal.Signals(signum).name)
        if task is not None:
            task.cancel()

    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, on_signal, s)
    ps: RemotePS | None = None
    workers: list[GrpcWorker] = []
    try:
        printer.line(
            f"{job.name}: starting {job.spec.ps.replicas} PS shard(s) and "
            f"{job.spec.workers.replicas} worker(s) (logs in {options.workdir / 'logs'})"
        )
        cluster.start()
        ps, workers = await connect(cluster, job, options.start_timeout)
        driver = Driver(
            job.spec,
            ps,
            workers,
            store,
            observer=Observer(
                on_action=_chain(printer.on_action, options.on_action),
                on_progress=printer.on_progress,
                on_restart=lambda what: printer.line(f"  {what}"),
            ),
            supervisor=cluster,
        )
        monitor = asyncio.create_task(_monitor(cluster, printer))
        try:
            progress = await driver.run()
        finally:
            monitor.cancel()
        printer.finish(progress)
        return progress
    except asyncio.CancelledError:
        progress = store.load() or Progress()
        printer.line(
            f"{job.name}: stopped by {', '.join(stopping) or 'cancel'}; progress saved in "
            f"{options.state_path} (run again to resume)"
        )
        return progress
    finally:
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(s)
        for w in workers:
            with contextlib.suppress(Exception):
                await w.close()
        if ps is not None:
            ps.close()
        cluster.stop()
