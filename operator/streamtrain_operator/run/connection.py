"""Clients of one job's PS shards and workers, opened together and closed together.

The driver needs a ``PSLike`` over every shard and one ``WorkerClient`` per worker; how the
endpoints are found differs (pod DNS names on Kubernetes, child processes' announced ports in
local mode), what is dialled with them does not: :func:`dial` builds the production
:class:`GrpcConnection` for both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from streamtrain_operator.run.driver import WorkerClient
from streamtrain_operator.run.worker_client import GrpcWorker
from streamtrain_ps.api import PSLike
from streamtrain_ps.client.remote import RemotePS
from streamtrain_ps.config import PSConfig
from streamtrain_ps.plumbing.tls import TLSFiles


class Connection(Protocol):
    """Clients of one job's PS shards and workers."""

    @property
    def ps(self) -> PSLike: ...

    @property
    def workers(self) -> Sequence[WorkerClient]: ...

    async def wait_ready(self, timeout: float) -> None:
        """Return once every shard and worker answers; raise otherwise."""
        ...

    async def close(self) -> None: ...


@dataclass
class GrpcConnection:
    """The production :class:`Connection`: RemotePS over every shard, one GrpcWorker each."""

    ps: RemotePS
    workers: list[GrpcWorker]
    #: The blocking PS readiness wait runs in a thread that cancelling cannot stop; close()
    #: lets it finish before closing the channels under it.
    _pending: asyncio.Future[None] | None = None

    async def wait_ready(self, timeout: float) -> None:
        self._pending = asyncio.get_running_loop().run_in_executor(
            None, self.ps.wait_ready, timeout
        )
        await asyncio.shield(self._pending)
        await asyncio.gather(*(w.wait_ready(timeout) for w in self.workers))

    async def close(self) -> None:
        if self._pending is not None:
            with contextlib.suppress(Exception):
                await self._pending
        for w in self.workers:
            with contextlib.suppress(Exception):
                await w.close()
        self.ps.close()


def dial(
    ps_endpoints: Sequence[str],
    worker_endpoints: Sequence[str],
    ps_config: PSConfig,
    worker_name: str = "worker",
    tls: TLSFiles | None = None,
) -> GrpcConnection:
    """Channels to every shard and worker (nothing is sent until ``wait_ready``); with
    ``tls``, over mutual TLS with the operator's certificate."""
    return GrpcConnection(
        RemotePS(list(ps_endpoints), ps_config, tls=tls),
        [
            GrpcWorker(ep, name=f"{worker_name}-{i}", tls=tls)
            for i, ep in enumerate(worker_endpoints)
        ],
    )
