"""Local mode: the job's PS shards and workers as child processes of ``streamtrain run``.

Each child is started (``streamtrain_ps.plumbing.launch``) with ``--port 0`` on 127.0.0.1 and
announces its bound address (``listening on HOST:PORT``); everything it prints goes to
``<workdir>/logs/<name>.log``. Children are tied to this process three ways, so none
outlives it: a normal exit stops them (SIGTERM, then SIGKILL after a grace period), a signal
or an exception runs the same ``finally``, and on Linux each child has ``PR_SET_PDEATHSIG``
(the launcher's ``die_with_parent``), so even a SIGKILLed ``streamtrain run`` takes its
children with it.

A child that dies while the job runs is restarted on its old port (``heal``), so clients
reconnect by address; a PS restart comes back empty, which the driver turns into a reload of
the last checkpoint and a replay (``Scheduler.restore``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from streamtrain_operator.job import render
from streamtrain_operator.job.spec import Job
from streamtrain_operator.run.connection import GrpcConnection, dial
from streamtrain_ps.plumbing.launch import Launched, LaunchError, launch, python_argv, stop_all


@dataclass
class Child:
    """A PS shard or worker: what to start again after it exits, and the running process."""

    role: str  # "ps" | "worker"
    args: tuple[str, ...]  # after the interpreter; "--port 0" until the first start
    launched: Launched
    #: The port it listens on (kept across restarts: clients know the address).
    port: str = "0"

    @property
    def name(self) -> str:
        return self.launched.name

    @property
    def address(self) -> str:
        return self.launched.address


class LocalCluster:
    """Starts and stops the PS shards and workers of one job on this machine."""

    def __init__(
        self,
        job: Job,
        workdir: Path,
        python: str = sys.executable,
        start_timeout: float = 120.0,
        ps_route: Callable[[str], str] | None = None,
        metrics_port: int | None = None,
    ) -> None:
        self.job = job
        #: The first component's Prometheus port: PS shard i serves on ``metrics_port + i``,
        #: worker j on ``metrics_port + shards + j`` (``metrics_targets``); None: no metrics.
        self.metrics_port = metrics_port
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
        """Start every PS shard and every worker at once; send the workers their config
        (with the PS endpoints) once the shards announced their addresses.

        A worker's start is mostly importing torch (2-5 s here), a shard's importing numba
        and loading its compiled kernels (1.5-2 s): started one after the other they added
        up. The worker reads its config from stdin (``--config -``) after its imports; a
        restarted worker reads the same config from its file.
        """
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
                    *self._metrics_args(i),
                ],
            )
            for i in range(n)
        ]
        worker_json = configs / "worker.json"
        workers = [
            self._spawn(
                f"worker-{i}",
                "worker",
                [
                    *("-m", "streamtrain_worker", "--port", "0", "--config", str(worker_json)),
                    *("--worker-index", str(i)),
                    *self._metrics_args(n + i),
                ],
                config_on_stdin=True,
            )
            for i in range(spec.workers.replicas)
        ]
        self.ps_endpoints = [self._await_listening(c) for c in shards]
        routed = [self.ps_route(endpoint) for endpoint in self.ps_endpoints]
        config = render.render_worker(spec, routed)
        worker_json.write_text(config)
        for w in workers:
            w.launched.send_input(config)
        self.worker_endpoints = [self._await_listening(c) for c in workers]

    def metrics_targets(self) -> list[tuple[str, str, int]]:
        """``(role, name, port)`` of every component's metrics endpoint (none without
        ``metrics_port``)."""
        if self.metrics_port is None:
            return []
        spec = self.job.spec
        shards = spec.ps.replicas
        return [("ps", f"ps-{i}", self.metrics_port + i) for i in range(shards)] + [
            ("worker", f"worker-{j}", self.metrics_port + shards + j)
            for j in range(spec.workers.replicas)
        ]

    def _metrics_args(self, component: int) -> tuple[str, ...]:
        if self.metrics_port is None:
            return ()
        return ("--metrics-port", str(self.metrics_port + component))

    def _spawn(
        self, name: str, role: str, args: Sequence[str], config_on_stdin: bool = False
    ) -> Child:
        """Start a child; ``config_on_stdin``: it reads ``--config`` from stdin this time
        (``args`` keep the file, for a restart)."""
        argv = list(args)
        if config_on_stdin:
            argv[argv.index("--config") + 1] = "-"
        launched = launch(
            name,
            python_argv(argv, python=self.python, die_with_parent=True),
            self.workdir / "logs" / f"{name}.log",
            announce=True,
            stdin=config_on_stdin,
        )
        child = Child(role, tuple(args), launched)
        self.children.append(child)
        return child

    async def heal(self) -> list[str]:
        """Restart every child that exited, on its old port (clients reconnect by address).

        Returns what was restarted. Spawning happens on the calling (event loop) thread:
        ``PR_SET_PDEATHSIG`` ties a child to the thread that forked it.
        """
        async with self._healing:
            healed = []
            for old in [c for c in self.children if c.launched.exited()]:
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
                    f"{old.name} exited with code {old.launched.process.returncode}; "
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
        """Wait for the child's ``listening on`` line; its port is kept for restarts."""
        address = child.launched.wait_listening(self.start_timeout)
        child.port = address.rsplit(":", 1)[1]
        return address

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every child, wait up to ``grace`` seconds, SIGKILL what is left."""
        stop_all([c.launched for c in self.children], grace)
        self.children.clear()

    async def connect(self, timeout: float) -> GrpcConnection:
        """Clients of every started shard and worker, once all of them answer."""
        conn = dial(self.ps_endpoints, self.worker_endpoints, render.ps_config(self.job.spec))
        try:
            await conn.wait_ready(timeout)
        except BaseException:
            await conn.close()
            raise
        return conn
