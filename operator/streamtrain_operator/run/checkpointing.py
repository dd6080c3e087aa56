"""The driver's checkpoint steps: in the workers' path, or written beside the next pass.

A checkpoint is the state a restore reloads, so it is recorded (``Progress.checkpoint``)
only once its files and manifest are published, and a failed or killed write must leave the
previous one the restore point. Written in the workers' path, the step simply waits for
the PS save. With ``checkpoint.besideTraining`` a checkpoint followed by a pass is instead
*taken* at the pass boundary — every PS shard copies its rows and dense vectors into memory
(``PSLike.snapshot``: the fence; later pushes change the tables, not the copy) — and the
step answers ``CheckpointTaken``: the machine completes the step, so the next pass trains,
but keeps the previous checkpoint as the restore point. The files are written by a task;
the driver collects it (``settle``) after the next action that is not a data check or a
wait — that pass — and before anything else (a reload, the end of the run), and only then
tells the machine the checkpoint is published (``Scheduler.checkpoint_written``), saves the
record naming it, and prunes the older checkpoints. In the path alike: the driver prunes
only after the next progress write, the one that names the new checkpoint (pruned earlier,
with ``keep: 1`` a kill would leave a record naming a deleted checkpoint).

Exactly once (docs/scheduler.md §3): a kill or a failure before the publication leaves the
record at the previous checkpoint with the step completed; the next run reloads that one
and replays the steps after it — checkpoint steps are never replayed — so every pass is
applied once, and the next checkpoint comes ``everyPasses`` later. A failure seen by the
driver (after the retries) fails the job with ``CheckpointFailed``, as in the path; the
pass beside it is then not recorded and is redone by the next run. The genesis checkpoint
and a checkpoint that is the job's last step stay in the path: a genesis recorded as
completed but never written would leave a job with no checkpoint at all, and after the last
step there is no pass to overlap.

Memory: a snapshot holds an encoded copy of every row of every shard until written (7 MB
per checkpoint in ``make bench-e2e``), which is why this is opt-in.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from streamtrain_operator.job.messages import CheckpointTaken, Done, Event, Failed, Save
from streamtrain_operator.job.plan import PassPlan, StepKind
from streamtrain_operator.job.spec import JobSpec
from streamtrain_operator.run import export, retention
from streamtrain_ps.api import PSLike, SaveMode
from streamtrain_ps.plumbing.retry import RetryPolicy

log = logging.getLogger(__name__)


@dataclass
class Checkpointer:
    """Runs the driver's checkpoint steps; holds the write of one taken beside a pass."""

    spec: JobSpec
    plan: PassPlan
    ps: PSLike
    retry: RetryPolicy
    sleep: Callable[[float], Awaitable[None]]
    on_phase: Callable[[str, float], None] | None = None

    def __post_init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._uri = ""
        #: A checkpoint written in the path whose older ones are not yet pruned.
        self._unpruned: str | None = None

    def beside(self, action: Save) -> bool:
        """Is this checkpoint written beside the next pass? (module docstring)"""
        key = action.key
        if not self.spec.checkpoint.besideTraining or key.pass_index == 0:
            return False
        following = self.plan.next_step(key)
        return following is not None and following.kind == StepKind.TRAIN

    async def step(self, action: Save) -> Event:
        """Save the checkpoint (``Done``), or take it and start its write
        (``CheckpointTaken``); ``Failed`` with ``CheckpointFailed`` after the retries."""
        try:
            if not self.beside(action):
                await export.with_retries(
                    "CheckpointFailed", lambda: self._save(action.uri), self.retry, self.sleep
                )
                return Done()
            # Named once for the step's retries: a retried snapshot is the same one.
            snapshot_id = uuid.uuid4().hex
            await export.with_retries(
                "CheckpointFailed",
                lambda: self._timed(
                    "checkpoint_snapshot",
                    asyncio.to_thread(self.ps.snapshot, SaveMode.CHECKPOINT, snapshot_id),
                ),
                self.retry,
                self.sleep,
            )
        except Exception as exc:  # every failure becomes a condition naming the cause
            log.exception("CheckpointFailed")
            return Failed("CheckpointFailed", str(exc))
        self._uri = action.uri
        self._task = asyncio.create_task(
            export.with_retries(
                "CheckpointFailed",
                lambda: self._timed(
                    "checkpoint_save",
                    asyncio.to_thread(
                        self.ps.save_snapshot, action.uri, SaveMode.CHECKPOINT, snapshot_id
                    ),
                ),
                self.retry,
                self.sleep,
            )
        )
        return CheckpointTaken()

    async def _save(self, uri: str) -> None:
        """Write and publish a checkpoint in the path; the older ones are pruned by
        :meth:`prune_recorded` once the record naming this one is saved."""
        await self._timed(
            "checkpoint_save", asyncio.to_thread(self.ps.save, uri, SaveMode.CHECKPOINT)
        )
        self._unpruned = uri

    async def prune_recorded(self, recorded: str | None) -> None:
        """The progress record naming ``recorded`` as the restore point is durable: if
        that is the checkpoint last written in the path, the older ones may go. A
        checkpoint written but not recorded (the step's outcome was discarded by a
        restore) prunes nothing: the record still names the one before."""
        uri, self._unpruned = self._unpruned, None
        if uri is not None and uri == recorded:
            await self.prune(uri)

    async def prune(self, newest: str) -> None:
        """Keep the newest ``checkpoint.keep`` checkpoints. Called only once the record
        naming ``newest`` is saved, in the path or beside a pass: until then the record
        names the one before, which must still be there (``keep: 1``)."""
        await self._timed(
            "prune",
            asyncio.to_thread(
                retention.prune_checkpoints,
                self.plan.checkpoint_root,
                newest,
                self.spec.checkpoint.keep,
            ),
        )

    async def _timed(self, phase: str, work: Awaitable[object]) -> None:
        started = time.perf_counter()
        await work
        if self.on_phase is not None:
            self.on_phase(phase, time.perf_counter() - started)

    @property
    def running(self) -> bool:
        """Is a write beside a pass still under way?"""
        return self._task is not None and not self._task.done()

    async def settle(self, wait: bool) -> tuple[str | None, Failed | None]:
        """Collect the write running beside the pass if it is done, or (``wait``) once it
        is: the published checkpoint's URI, or its failure as ``CheckpointFailed``."""
        task = self._task
        if task is None or not (wait or task.done()):
            return None, None
        self._task = None
        try:
            await task
        except Exception as exc:
            log.exception("checkpoint %s", self._uri)
            return None, Failed("CheckpointFailed", f"{self._uri}: {exc}")
        return self._uri, None

    async def cancel(self) -> None:
        """The run is cancelled (a signal), or the PS lost the snapshot being written: stop
        the write; the record keeps the previous checkpoint, which is what gets reloaded."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
