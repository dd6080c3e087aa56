"""The thin async driver: executes the scheduler's actions against the PS, workers and storage.

All decisions are the state machine's (``scheduler.py``); this module only performs them and
reports what happened: donefile checks and file listings through fsspec
(``streamtrain_worker.data.layout``), deterministic file assignment
(``streamtrain_worker.data.sharding``), ``RunPass`` on every worker in parallel with the
generation fence, merging of the workers' histograms into global metrics
(``streamtrain_worker.metrics``), PS saves, loads and shrinks (blocking ``PSLike`` calls run in
threads), and model publication (``export.py``). Progress is saved through the injected
``StateStore`` before and after every action. Clock and sleep are injected, so tests run
without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from streamtrain_operator.job.messages import (
    Action,
    CheckData,
    DataChecked,
    Done,
    Event,
    Failed,
    LoadCheckpoint,
    PassRan,
    ResetWorkers,
    RunPass,
    Save,
    Shrink,
    Sleep,
    Terminal,
)
from streamtrain_operator.job.plan import PassPlan, StepKey, StepKind
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.scheduler import Policy, Scheduler
from streamtrain_operator.job.spec import JobSpec
from streamtrain_operator.run import (
    checkpointing,
    export,
    next_pass,
    passfiles,
    publishing,
    retention,
    worker_errors,
    worker_reset,
)
from streamtrain_operator.run.hooks import AFTER, BEFORE, NO_HOOK, StepHook
from streamtrain_operator.run.state import StateStore
from streamtrain_ps.api import PSLike, SaveMode
from streamtrain_ps.errors import CheckpointError, PSUnavailableError
from streamtrain_ps.plumbing.retry import RetryPolicy
from streamtrain_worker.data import layout
from streamtrain_worker.data.sharding import assign_files
from streamtrain_worker.metrics import PassMetrics
from streamtrain_worker.proto.share import PassShare

log = logging.getLogger(__name__)

SAVE_MODES = {
    StepKind.DELTA: SaveMode.DELTA,
    StepKind.BASE: SaveMode.BASE,
    StepKind.BATCH: SaveMode.BATCH,
    StepKind.CHECKPOINT: SaveMode.CHECKPOINT,
}


class WorkerClient(Protocol):
    """One worker's control service (``worker.proto``), as the driver needs it."""

    name: str

    async def run_pass(self, share: PassShare) -> Any:
        """Returns a ``worker_pb2.PassResult``. ``share.next_files``: the worker's share of
        the next pass, to read ahead (a hint, ``next_pass``)."""
        ...

    async def export_dense(self, uri: str, snapshot_id: str = "") -> list[str]:
        """Write the dense part of a model below ``uri``: the PS's current dense vectors, or
        (``snapshot_id``) those of that PS snapshot save, which may run beside a pass."""
        ...

    async def reset(self, generation: int) -> None:
        """Resync with the PS; a pass of an older generation still running is cancelled
        first (``control/service.py``)."""
        ...


class StaleResultError(RuntimeError):
    """A worker answered for another generation (a result of an older run)."""


def policy_from_spec(spec: JobSpec) -> Policy:
    return Policy(
        num_workers=spec.workers.replicas,
        poll_seconds=spec.data.pollSeconds,
        missing_deadline_seconds=spec.data.missingDeadlineSeconds,
        fail_on_missing=spec.data.onMissing == "fail",
        pass_retries=spec.workers.passRetries,
    )


class RestartWatch(Protocol):
    """Tells the driver which PS shards and workers restarted, so it knows when model state
    was lost. ``LocalCluster`` restarts dead children itself (local mode); ``PodRestarts``
    notices pods the kubelet restarted (Kubernetes).
    """

    #: How many PS shard restarts so far: each one lost that shard's model state.
    ps_restarts: int
    #: What the last PS restart was (for the condition's message).
    last_ps_restart: str
    #: How many worker restarts so far (reported only: a worker that died during a pass
    #: failed its share, and the scheduler restores for that).
    worker_restarts: int
    last_worker_restart: str

    async def heal(self) -> list[str]:
        """Bring back what died where this side can (same address), and say what restarted
        since the last call."""
        ...


@dataclass(frozen=True)
class Observer:
    """Hooks for progress output; every hook is optional."""

    on_action: Callable[[Action, Progress], None] | None = None
    on_progress: Callable[[Progress], None] | None = None
    on_restart: Callable[[str], None] | None = None
    #: ``(phase, seconds)`` for the parts of a step (``export.PHASES``, ``state``, ``prune``,
    #: ``assign``): where a pass transition's time goes (``make bench-e2e``).
    on_phase: Callable[[str, float], None] | None = None


class Driver:
    """Runs one job to a terminal phase (or until ``stop``)."""

    def __init__(
        self,
        spec: JobSpec,
        ps: PSLike,
        workers: Sequence[WorkerClient],
        store: StateStore,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        observer: Observer | None = None,
        restarts: RestartWatch | None = None,
        retry_on: tuple[type[BaseException], ...] = (OSError, CheckpointError, PSUnavailableError),
        step_hook: StepHook = NO_HOOK,
    ) -> None:
        if len(workers) != spec.workers.replicas:
            raise ValueError(
                f"{len(workers)} workers for spec.workers.replicas={spec.workers.replicas}"
            )
        self.spec = spec
        self.plan = PassPlan.from_spec(spec)
        self.ps = ps
        self.workers = list(workers)
        self.store = store
        self.clock = clock
        self.sleep = sleep
        self.observer = observer or Observer()
        self.restart_watch = restarts
        self.retry = RetryPolicy.storage(
            spec.export.retries, spec.export.retryBackoffSeconds, retry_on
        )
        progress = store.load() or Progress()
        self.machine = Scheduler(self.plan, policy_from_spec(spec), progress)
        # Results of the train step in progress, by worker (merged once all are in).
        self._results: dict[int, PassMetrics] = {}
        self._results_key: StepKey | None = None
        self._pass_started = 0.0
        #: Offered every first run of a step (``hooks``): a no-op outside the fault tests.
        self.step_hook = step_hook
        # Restores after a worker loss, by pass: bounded by passRetries, then shares retry.
        self._worker_restores: dict[StepKey, int] = {}
        #: The model steps; the end of a publication runs beside the next pass.
        self.publisher = publishing.Publisher(
            spec,
            self.plan,
            ps,
            export_dense=self.workers[0].export_dense,
            retry=self.retry,
            sleep=sleep,
            clock=clock,
            hook=step_hook,
            on_phase=self.observer.on_phase,
        )
        #: The checkpoint steps; with ``checkpoint.besideTraining`` written beside a pass.
        self.checkpointer = checkpointing.Checkpointer(
            spec, self.plan, ps, self.retry, sleep, self.observer.on_phase
        )

    async def _hold(self, point: str, action: Action) -> None:
        """Offer a step to the hook: only real steps run for the first time (a replay
        redoes one already recorded)."""
        if isinstance(action, RunPass | Save | Shrink) and not action.replay:
            await self.step_hook.hold(point, action.key)

    def stop(self, phase: str = Phase.STOPPED, message: str = "") -> None:
        """Finish the current action, then stop (progress stays resumable)."""
        self.machine.request_stop(phase, message)

    async def run(self) -> Progress:
        # A replayed export saves into a scratch directory it removes when done; a kill in
        # between leaves it behind. No step runs yet, so whatever is there is such a leftover.
        await asyncio.to_thread(retention.remove, self.publisher.scratch_root)
        try:
            return await self._loop()
        finally:
            await self.publisher.cancel()  # cancelled (a signal): the rerun publishes it
            await self.checkpointer.cancel()  # not recorded: the rerun reloads the one before

    async def _loop(self) -> Progress:
        while True:
            action = self.machine.next_action(self.clock())
            self._save()
            # A checkpoint written in the path is the restore point only from this write on.
            recorded = self.machine.progress.checkpoint
            await self.checkpointer.prune_recorded(None if recorded is None else recorded.uri)
            if isinstance(action, Terminal):
                failed = await self.publisher.settle(wait=True)
                if failed is not None:  # recorded, not published: the next run publishes it
                    log.error("%s: %s", failed.reason, failed.message)
                # A stop during the pass beside a checkpoint: recorded if it was written.
                failed = await self._checkpoint_written(wait=True)
                if failed is not None:  # the record keeps the one before: the rerun reloads it
                    log.error("%s: %s", failed.reason, failed.message)
                return self.machine.progress
            if self.observer.on_action is not None:
                self.observer.on_action(action, self.machine.progress)
            restarts = self._restarts()
            await self._hold(BEFORE, action)
            failed = await self.publisher.settle(wait=not publishing.beside(action))
            failed = await self._checkpoint_written(not publishing.beside(action)) or failed
            if failed is not None and isinstance(action, LoadCheckpoint):
                # A restore: the model's step comes after the checkpoint it reloads (every
                # checkpoint waits for the publications before it), so its replay publishes it.
                log.warning("%s; the replay publishes it", failed.message)
                failed = None
            try:
                event = failed or await self.execute(action)
            except Exception as exc:  # a bug or an unforeseen error: a condition, not a crash
                log.exception("%s", action)
                event = Failed("InternalError", f"{action}: {type(exc).__name__}: {exc}")
            event = await self.publisher.settle(wait=False) or event
            await self._hold(AFTER, action)
            if self.restart_watch is not None:
                healed = await self.restart_watch.heal()
                for what in healed:
                    if self.observer.on_restart is not None:
                        self.observer.on_restart(what)
                lost = self._state_lost(restarts)
                if lost is not None:
                    if self.checkpointer.running:  # its snapshot went with the shard
                        await self.checkpointer.cancel()
                        log.warning("a checkpoint being written was lost with the PS")
                    elif await self._checkpoint_written(wait=True) is not None:
                        log.warning("a checkpoint failed before the PS was lost")
                    self.machine.restore(lost[1], self.clock(), cause=lost[0])
                    self._save()
                    continue
            # A checkpoint written beside a pass (started by a Save) is collected once that
            # pass ran, before its outcome: a restore must find it recorded if published.
            beside = isinstance(action, CheckData | Sleep | Save)
            event = await self._checkpoint_written(wait=not beside) or event
            # "X done" is saved by the top of the loop together with "about to do Y": nothing
            # but the pure ``next_action`` runs in between, so a second write (two fsyncs, or
            # a status patch) would only repeat it.
            self.machine.handle(event, self.clock())

    async def _checkpoint_written(self, wait: bool) -> Failed | None:
        """Collect a checkpoint written beside a pass (``checkpointing``): record it once
        published; its failure, if it failed."""
        uri, failed = await self.checkpointer.settle(wait)
        if uri is not None:
            self.machine.checkpoint_written(uri)
            self._save()  # the new restore point is durable: the older ones may go
            await self.checkpointer.prune(uri)
        return failed

    def _restarts(self) -> tuple[int, int]:
        if self.restart_watch is None:
            return 0, 0
        return self.restart_watch.ps_restarts, self.restart_watch.worker_restarts

    def _state_lost(self, before: tuple[int, int]) -> tuple[str, str] | None:
        """Did a PS restart during the action make the PS state unknown? (cause, message)

        A PS shard that came back empty voids the outcome of the action. A worker restart
        needs nothing here: a worker that died during a pass failed its share, and the
        scheduler restores after every share failure that may have pushed
        (``Scheduler._on_share_failed``) — also when the restart is noticed only later,
        as with a kubelet that restarts with back-off.
        """
        assert self.restart_watch is not None
        if self.restart_watch.ps_restarts != before[0]:
            return "PSRestarted", self.restart_watch.last_ps_restart or "a PS shard restarted"
        return None

    def _timed(self, phase: str, started: float) -> None:
        if self.observer.on_phase is not None:
            self.observer.on_phase(phase, time.perf_counter() - started)

    def _save(self) -> None:
        started = time.perf_counter()
        self.store.save(self.machine.progress)
        self._timed("state", started)
        if self.observer.on_progress is not None:
            self.observer.on_progress(self.machine.progress)

    # ------------------------------------------------------------------ actions

    async def execute(self, action: Action) -> Event:
        if isinstance(action, CheckData):
            missing = await asyncio.to_thread(self._missing_folders, action.key)
            return DataChecked(tuple(missing))
        if isinstance(action, Sleep):
            await self.sleep(action.seconds)
            return Done()
        if isinstance(action, RunPass):
            return await self._run_pass(action)
        if isinstance(action, Save):
            return await self._save_step(action)
        if isinstance(action, Shrink):
            return await self._guard("ShrinkFailed", self._shrink)
        if isinstance(action, LoadCheckpoint):
            return await self._guard("RestoreFailed", lambda: self._load(action.uri))
        if isinstance(action, ResetWorkers):
            return await self._guard("RestoreFailed", self._reset_workers)
        raise TypeError(f"unknown action {action!r}")

    async def _guard(self, reason: str, fn: Callable[[], Awaitable[Event]]) -> Event:
        try:
            return await export.with_retries(reason, fn, self.retry, self.sleep)
        except Exception as exc:  # every failure becomes a condition naming the cause
            log.exception("%s", reason)
            return Failed(reason, str(exc))

    def _folders(self, key: StepKey) -> list[str]:
        return next_pass.pass_folders(self.spec, key)

    def _missing_folders(self, key: StepKey) -> list[str]:
        donefile = self.spec.data.donefile
        return [f for f in self._folders(key) if not layout.folder_ready(f, donefile)]

    async def _dispatch(
        self, action: RunPass
    ) -> tuple[list[list[str]], passfiles.PassFiles, list[list[str]]]:
        """The pass's assignment and recorded list (``_assignment``), and every worker's
        files of the next pass to read ahead (``next_pass``), listed at once: on an object
        store each listing is a round trip, and the hint must not add one to the dispatch."""
        hint = asyncio.to_thread(
            next_pass.next_shares, self.spec, self.plan, action.key, len(self.workers)
        )
        (assignment, files), ahead = await asyncio.gather(
            asyncio.to_thread(self._assignment, action), hint
        )
        return assignment, files, ahead

    def _assignment(self, action: RunPass) -> tuple[list[list[str]], passfiles.PassFiles]:
        """Every worker's files of the pass, from the pass's recorded file list.

        The first dispatch lists the folders and records the list (``passfiles``); a replay
        or a share retry uses the record after verifying it (``DataChangedError`` when a
        file is gone or changed). A pass started afresh (attempt 1, not a replay) has
        nothing in the model yet, so a changed folder is listed and recorded again.
        """
        donefile = self.spec.data.donefile
        uri = passfiles.record_uri(self.plan.checkpoint_root, action.key)
        where = f"pass {action.key.day}/{action.key.pass_index}"
        recorded = passfiles.load(uri)
        files = recorded
        if recorded is not None:
            try:
                passfiles.verify(recorded, donefile, where, uri)
            except passfiles.DataChangedError:
                if action.replay or action.attempt > 1:
                    raise
                log.warning("%s: its data changed before it was trained; listing it again", where)
                files = None
        elif action.replay:
            log.warning("%s: no recorded file list (an older record); listing it now", where)
        if files is None:
            files = passfiles.list_pass(self._folders(action.key), donefile)
            passfiles.save(uri, files)
        sized = [(f.path, f.size) for f in files.files]
        return assign_files(sized, len(self.workers)), files

    async def _run_pass(self, action: RunPass) -> Event:
        if self._results_key != action.key or action.attempt == 1:
            self._results, self._results_key = {}, action.key
            self._pass_started = self.clock()
        started = time.perf_counter()
        try:
            assignment, files, ahead = await self._dispatch(action)
            self._timed("assign", started)
        except passfiles.DataChangedError as exc:
            return Failed("DataChanged", str(exc))
        except OSError as exc:  # nothing was dispatched: a retry of every share is safe
            return PassRan(
                dict.fromkeys(action.shares, f"cannot list the pass's files: {exc}"),
                refused=frozenset(action.shares),
            )
        timeout = self.spec.workers.passTimeoutSeconds

        async def one(w: int) -> PassMetrics:
            key = action.key
            share = PassShare.of(
                key.day, key.pass_index, assignment[w], action.generation, next_files=ahead[w]
            )
            call = self.workers[w].run_pass(share)
            result = await (asyncio.wait_for(call, timeout) if timeout else call)
            if int(result.generation) != action.generation:
                raise StaleResultError(
                    f"result of generation {result.generation}, expected {action.generation}"
                )
            return PassMetrics.from_proto(result)

        outcomes = await asyncio.gather(*(one(w) for w in action.shares), return_exceptions=True)
        failed: dict[int, str] = {}
        refused: set[int] = set()
        for w, outcome in zip(action.shares, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if isinstance(outcome, asyncio.CancelledError):
                    raise outcome
                failed[w] = worker_errors.describe(outcome, self.workers[w].name)
                if worker_errors.refused(outcome):
                    refused.add(w)
            else:
                self._results[w] = outcome
        where = f"pass {action.key.day}/{action.key.pass_index}"
        for w, outcome in zip(action.shares, outcomes, strict=True):
            # Bad data, a vanished file, a PS memory limit too small: retrying fails alike.
            if isinstance(outcome, BaseException):
                permanent = worker_errors.permanent(outcome, where, self.workers[w].name)
                if permanent is not None:
                    return Failed(*permanent)
        if failed:
            return PassRan(failed, refused=frozenset(refused))
        parts = [self._results[w] for w in range(len(self.workers))]
        total = PassMetrics.sum(parts, parts[0].num_buckets)
        wall = max(self.clock() - self._pass_started, 1e-9)
        metrics = {
            **total.summary(),
            "seconds": wall,
            "trainSeconds": total.train_seconds,
            "examplesPerSecond": total.examples / wall,
            "badLines": float(total.bad_lines),
            "files": float(total.files_read),
            "filesReadAhead": float(total.files_read_ahead),
            "skippedFiles": float(len(files.skipped)),
            "bytes": float(sum(f.size for f in files.files)),
        }
        return PassRan({}, metrics)

    async def _save_step(self, action: Save) -> Event:
        key = action.key
        mode = SAVE_MODES[key.kind]
        if key.kind == StepKind.CHECKPOINT:
            return await self.checkpointer.step(action)
        return await self.publisher.step(action, mode, self.machine.progress.history)

    async def _shrink(self) -> Event:
        result = await asyncio.to_thread(self.ps.shrink)
        return Done({"deleted": float(result.deleted), "keys": float(result.keys_after)})

    async def _load(self, uri: str) -> Event:
        await worker_reset.wait_for_idle(
            self.workers,
            self.machine.progress.generation,
            self.spec.workers.passTimeoutSeconds,
            self.sleep,
        )
        # A restore replaces the live state, which is to be discarded anyway: release it
        # first (once every part is verified), half the peak of keeping it until the swap.
        keys = await asyncio.to_thread(self.ps.load, uri, discard_live=True)
        return Done({"keys": float(keys)})

    async def _reset_workers(self) -> Event:
        generation = self.machine.progress.generation
        await asyncio.gather(*(w.reset(generation) for w in self.workers))
        return Done()
