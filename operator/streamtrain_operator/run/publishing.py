"""The driver's model steps (delta, base, batch): publish a model, with its end beside the
next pass.

A model step takes the model (``export.write_parts``: the PS's snapshot of the sparse rows
and the dense vectors) and is then recorded as done; the rest of its publication — worker
0 exporting the snapshot's dense vectors as TorchScript, writing the snapshot's sparse
parts, ``MODEL.json``, the donefile line — only writes what was taken, so it runs as a task
while the next pass's data check and training go on (``beside``). ``settle`` collects it:
when it is done, and always before any other step (a later model's line must follow its
line, a checkpoint must not be recorded before the models it follows — a replay never
reaches back past it — and a reload or the end of the run must not race it). Its failure
fails the job with ``ExportFailed``.

Exactly once: a model step recorded but not in the donefile (a kill or a failure in that
end) is published by its replay — the replay rebuilt the model state of that moment from
the last checkpoint, which always precedes it. A model already published is only saved to
a scratch location, for its PS side effects (``delta_score`` reset, ``unseen_days`` aged).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from streamtrain_operator.job import render
from streamtrain_operator.job.messages import (
    Action,
    CheckData,
    Done,
    Event,
    Failed,
    RunPass,
    Save,
    Sleep,
)
from streamtrain_operator.job.plan import PassPlan, StepKind, join_uri
from streamtrain_operator.job.progress import PassRecord
from streamtrain_operator.job.spec import JobSpec
from streamtrain_operator.run import export, retention
from streamtrain_operator.run.hooks import NO_HOOK, StepHook
from streamtrain_ps.api import PSLike, SaveMode
from streamtrain_ps.plumbing.retry import RetryPolicy
from streamtrain_worker.config import MetricsConfig
from streamtrain_worker.publishing.model_folder import ModelKind, Serving

log = logging.getLogger(__name__)


def beside(action: Action) -> bool:
    """May ``action`` run while the end of a model's publication is still being written?
    Only the next pass's data check, wait and training: they neither read nor change what
    is being written (module docstring for everything else)."""
    return isinstance(action, CheckData | Sleep) or (
        isinstance(action, RunPass) and not action.replay
    )


@dataclass
class Publisher:
    """Runs the driver's model steps; holds the end of the last one while it runs."""

    spec: JobSpec
    plan: PassPlan
    ps: PSLike
    #: Worker 0's ``ExportDense(uri, snapshot_id)`` (``driver.WorkerClient``).
    export_dense: Callable[[str, str], Awaitable[Sequence[str]]]
    retry: RetryPolicy
    sleep: Callable[[float], Awaitable[None]]
    clock: Callable[[], float] = time.time
    hook: StepHook = NO_HOOK
    on_phase: Callable[[str, float], None] | None = None

    def __post_init__(self) -> None:
        self._task: asyncio.Task[object] | None = None
        self._key = ""

    @property
    def scratch_root(self) -> str:
        """Where replayed exports save (they only want the save's PS-side effects)."""
        return join_uri(self.plan.checkpoint_root, "_scratch")

    async def step(self, action: Save, mode: SaveMode, history: Sequence[PassRecord]) -> Event:
        key = action.key
        rel = action.uri[len(self.plan.export_root.rstrip("/")) + 1 :]
        if export.published(self.plan.export_root, rel) is not None:
            # Already published: only the PS state side effect of the save is wanted.
            scratch = join_uri(
                self.scratch_root,
                f"g{action.generation}-{key.day}-{key.pass_index}-{key.kind.value}",
            )

            async def replay() -> Event:
                await asyncio.to_thread(self.ps.save, scratch, mode)
                await asyncio.to_thread(retention.remove, scratch)
                return Done()

            try:
                return await export.with_retries("ExportFailed", replay, self.retry, self.sleep)
            except Exception as exc:
                log.exception("ExportFailed")
                return Failed("ExportFailed", str(exc))
        target = export.ModelTarget(
            root=self.plan.export_root,
            key=rel,
            kind=ModelKind(key.kind.value),
            day=key.day,
            pass_index=key.pass_index,
            base=self.plan.base_of_delta(key) if key.kind == StepKind.DELTA else None,
        )
        record = next(
            (r for r in reversed(history) if (r.day, r.pass_index) == (key.day, key.pass_index)),
            None,
        )
        # Named once for the step's retries: a retried snapshot applies nothing twice.
        snapshot_id = uuid.uuid4().hex
        try:
            parts = export.ModelParts(
                snapshot=lambda: asyncio.to_thread(self.ps.snapshot, mode, snapshot_id),
                save_sparse=lambda uri: asyncio.to_thread(
                    self.ps.save_snapshot, uri, mode, snapshot_id
                ),
                # the dense vectors of the same snapshot, read beside the next pass
                export_dense=lambda uri: self.export_dense(uri, snapshot_id),
                metrics={} if record is None else record.metrics,
                serving=Serving(
                    data=self.spec.data.data_config().to_dict(),
                    table=render.TABLE,
                    num_buckets=MetricsConfig().numBuckets,
                    model=self.spec.model.type,
                ),
            )
            steps = export.StorageSteps(
                policy=self.retry,
                sleep=self.sleep,
                clock=self.clock,
                hook=NO_HOOK if action.replay else self.hook,  # hooks hold first runs only
                on_phase=self.on_phase,
            )
            publish = await export.write_parts(target, parts, steps)
            if action.replay:  # recorded but never published (module docstring)
                await publish()
        except Exception as exc:
            log.exception("export %s", target.uri)
            return Failed("ExportFailed", str(exc))
        if not action.replay:
            self._task = asyncio.create_task(publish())
            self._key = target.key
        return Done()

    async def settle(self, wait: bool) -> Failed | None:
        """Collect the publication running beside the passes if it is done, or (``wait``)
        once it is; its failure (storage, after the retries) as ``ExportFailed``."""
        task = self._task
        if task is None or not (wait or task.done()):
            return None
        self._task = None
        try:
            await task
        except Exception as exc:
            log.exception("export %s", self._key)
            return Failed("ExportFailed", f"{self._key}: {exc}")
        return None

    async def cancel(self) -> None:
        """The run is cancelled (a signal): stop the publication; the rerun publishes it."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
