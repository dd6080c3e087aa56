"""The pure step plan of a job: which steps run, in which order, and where they write.

A job is an ordered sequence of steps, each keyed by ``(day, pass, kind)``. For every day
from ``startDay`` (to ``endDay`` or forever) and every pass ``p`` in ``1..P``:

- ``train`` (wait for the pass's donefiles, then RunPass on every worker);
- ``delta`` when ``deltaEveryPasses`` divides ``p``;
- ``checkpoint`` when ``everyPasses`` divides ``p`` and ``p < P``;

and at the end of the day (keyed with pass ``P``): ``shrink``, ``base`` (inference model for
the next day), ``batch`` (save mode 3, ages unseen_days), ``checkpoint`` (always: a day
never ends without a restore point, so a restart never redoes a shrink already covered by
a checkpoint).

A job opens with the *genesis checkpoint*, keyed ``(startDay, 0, checkpoint)`` and written
to ``<checkpoint>/<startDay>/pass-0-g<generation>`` (``checkpoints``): the PS state before
any training (the workers' initial dense parameters, no sparse keys). Every later restore
therefore has a checkpoint to reload, so the passes before the first regular checkpoint are
replayed on a known state too (on a PS with several shards, or whose pods outlive the
operator, the surviving state would otherwise see those passes twice).

The order is total, so durable progress is one step key, and "everything after the last
checkpoint up to the last completed step" is well defined (that is what a restart replays).
This module has no I/O and no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from streamtrain_operator.job.checkpoints import CheckpointName
from streamtrain_operator.job.spec import JobSpec
from streamtrain_worker.data.timeslices import next_day
from streamtrain_worker.publishing.model_folder import ModelKind, model_key


class StepKind(StrEnum):
    TRAIN = "train"
    DELTA = "delta"
    CHECKPOINT = "checkpoint"
    SHRINK = "shrink"
    BASE = "base"
    BATCH = "batch"


#: Order of the kinds within a pass (see ``PassPlan.position``).
_RANK = {
    StepKind.TRAIN: 0,
    StepKind.DELTA: 1,
    StepKind.CHECKPOINT: 2,
    StepKind.SHRINK: 3,
    StepKind.BASE: 4,
    StepKind.BATCH: 5,
}

#: Steps that publish an inference model (save modes 1, 2, 3).
EXPORT_KINDS = frozenset({StepKind.DELTA, StepKind.BASE, StepKind.BATCH})


@dataclass(frozen=True)
class StepKey:
    """One step of the job: ``20261101/3/train``."""

    day: str
    pass_index: int
    kind: StepKind

    def __str__(self) -> str:
        return f"{self.day}/{self.pass_index}/{self.kind.value}"

    def to_dict(self) -> dict[str, Any]:
        return {"day": self.day, "pass": self.pass_index, "step": self.kind.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepKey:
        return cls(str(data["day"]), int(data["pass"]), StepKind(data["step"]))


def join_uri(root: str, *parts: str) -> str:
    """``root/part/...`` for local paths and URLs alike (fsspec uses ``/`` everywhere)."""
    return "/".join([root.rstrip("/"), *parts])


@dataclass(frozen=True)
class PassPlan:
    """The step sequence of one job (derived from its spec, nothing else)."""

    start_day: str
    end_day: str | None
    passes_per_day: int
    delta_every: int
    checkpoint_every: int
    base: bool
    batch: bool
    export_root: str
    checkpoint_root: str

    @classmethod
    def from_spec(cls, spec: JobSpec) -> PassPlan:
        return cls(
            start_day=spec.data.startDay,
            end_day=spec.data.endDay,
            passes_per_day=spec.data.passes_per_day,
            delta_every=spec.export.deltaEveryPasses,
            checkpoint_every=spec.checkpoint.everyPasses,
            base=spec.export.base,
            batch=spec.export.batchModel,
            export_root=spec.export.path,
            checkpoint_root=spec.checkpoint.path,
        )

    @property
    def genesis(self) -> StepKey:
        """The job's first step: the checkpoint of the untrained model (pass 0)."""
        return StepKey(self.start_day, 0, StepKind.CHECKPOINT)

    def day_steps(self, day: str) -> tuple[StepKey, ...]:
        """Every step of ``day``, in order (the start day opens with the genesis checkpoint)."""
        last = self.passes_per_day
        steps: list[StepKey] = [self.genesis] if day == self.start_day else []
        for p in range(1, last + 1):
            steps.append(StepKey(day, p, StepKind.TRAIN))
            if self.delta_every and p % self.delta_every == 0:
                steps.append(StepKey(day, p, StepKind.DELTA))
            if p % self.checkpoint_every == 0 and p < last:
                steps.append(StepKey(day, p, StepKind.CHECKPOINT))
        steps.append(StepKey(day, last, StepKind.SHRINK))
        if self.base:
            steps.append(StepKey(day, last, StepKind.BASE))
        if self.batch:
            steps.append(StepKey(day, last, StepKind.BATCH))
        steps.append(StepKey(day, last, StepKind.CHECKPOINT))
        return tuple(steps)

    def in_range(self, day: str) -> bool:
        return day >= self.start_day and (self.end_day is None or day <= self.end_day)

    def position(self, key: StepKey) -> tuple[str, int, int]:
        """Sort key of any step, in this plan or not: ``(day, pass, rank of the kind)``.

        Ranks follow the order of ``day_steps`` (a checkpoint of the last pass ranks after
        the day-end steps), so a step recorded under another version of the spec (say
        ``deltaEveryPasses`` changed between two runs) still has a well-defined place and
        the job resumes right after it.
        """
        day_end = key.pass_index >= self.passes_per_day
        rank = 6 if key.kind == StepKind.CHECKPOINT and day_end else _RANK[key.kind]
        return key.day, key.pass_index, rank

    def first_step(self) -> StepKey:
        return self.day_steps(self.start_day)[0]

    def next_step(self, key: StepKey | None) -> StepKey | None:
        """The step after ``key`` (the first step for ``None``); ``None`` past ``endDay``."""
        if key is None:
            return self.first_step()
        here = self.position(key)
        for step in self.day_steps(key.day):
            if self.position(step) > here:
                return step
        following = next_day(key.day)
        return self.day_steps(following)[0] if self.in_range(following) else None

    def next_train(self, key: StepKey) -> StepKey | None:
        """The first train step after ``key`` (``None`` past ``endDay``)."""
        step = self.next_step(key)
        while step is not None and step.kind != StepKind.TRAIN:
            step = self.next_step(step)
        return step

    def steps_between(self, after: StepKey | None, upto: StepKey | None) -> list[StepKey]:
        """Steps strictly after ``after`` up to and including ``upto``."""
        if upto is None:
            return []
        out: list[StepKey] = []
        key = self.next_step(after)
        end = self.position(upto)
        while key is not None and self.position(key) <= end:
            out.append(key)
            key = self.next_step(key)
        return out

    def is_day_end(self, key: StepKey) -> bool:
        return key.pass_index == self.passes_per_day and key.kind != StepKind.TRAIN

    # ------------------------------------------------------------------ where steps write

    def export_uri(self, key: StepKey) -> str:
        """``<export>/<day>/delta-<pass>``, ``<export>/<next day>/base``, ``<export>/<day>/batch``.

        The base published at the end of day D is the starting point of day D+1's deltas,
        so it lives under D+1.
        """
        if key.kind == StepKind.DELTA:
            return join_uri(self.export_root, model_key(ModelKind.DELTA, key.day, key.pass_index))
        if key.kind == StepKind.BASE:
            return join_uri(self.export_root, model_key(ModelKind.BASE, next_day(key.day)))
        if key.kind == StepKind.BATCH:
            return join_uri(self.export_root, model_key(ModelKind.BATCH, key.day))
        raise ValueError(f"{key} is not an export step")

    def base_of_delta(self, key: StepKey) -> str | None:
        """Export key (relative to the export root) of the base a delta applies to.

        ``None`` on the first day and, with ``export.base: false``, on every day: such a
        delta applies to every delta without a base before it, back to the job's first
        (``streamtrain_worker.publishing.predict.model_chain``)."""
        if key.day == self.start_day or not self.base:
            return None
        return model_key(ModelKind.BASE, key.day)

    def checkpoint_uri(self, key: StepKey, generation: int) -> str:
        """A fresh directory per attempt: a published checkpoint is never overwritten."""
        name = CheckpointName(key.day, key.pass_index, generation)
        return join_uri(self.checkpoint_root, name.path)
