"""The fakes the operator tests share: the job the scripted workers run (the workers
themselves are ``scripted_workers``'s, shared with the fault tests), a fake kube layer for
the handlers, and a scripted world for the pass scheduler.

One module, so no test module imports another (``tests/operator`` is not a package: its
folder is on the path while its tests run).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from streamtrain_operator.job.messages import (
    Action,
    CheckData,
    DataChecked,
    Done,
    Event,
    LoadCheckpoint,
    PassRan,
    ResetWorkers,
    RunPass,
    Save,
    Shrink,
    Sleep,
    Terminal,
)
from streamtrain_operator.job.plan import PassPlan
from streamtrain_operator.job.progress import Progress
from streamtrain_operator.job.scheduler import Policy, Scheduler
from streamtrain_operator.job.spec import Job, parse_job
from streamtrain_operator.kube.daemon import Runtime

# ------------------------------------------------------- the job the scripted workers run

MANIFEST: dict[str, Any] = {
    "apiVersion": "streamtrain.io/v1alpha1",
    "kind": "StreamingTrainingJob",
    "metadata": {"name": "d"},
    "spec": {
        "data": {
            "path": "data",
            "format": "criteo",
            "startDay": "20261101",
            "endDay": "20261101",
            "splitIntervalMinutes": 720,
            "pollSeconds": 5,
            "missingDeadlineSeconds": 10,
        },
        "model": {"embeddingDim": 2},
        "sparse": {"baseThreshold": 0, "deltaThreshold": 0},
        "ps": {"logicalShards": 4},
        "workers": {"replicas": 2, "passRetries": 1},
        "checkpoint": {"path": "ckpt", "everyPasses": 1, "keep": 2},
        "export": {"path": "export", "retries": 0},
    },
}


def make_job(
    root: Path,
    keep: int = 2,
    workers: dict[str, Any] | None = None,
    export: dict[str, Any] | None = None,
    **data: Any,
) -> Job:
    m = copy.deepcopy(MANIFEST)
    m["spec"]["data"].update(data)
    m["spec"]["workers"].update(workers or {})
    m["spec"]["export"].update(export or {})
    m["spec"]["checkpoint"]["keep"] = keep
    for section in ("data", "checkpoint", "export"):
        path = m["spec"][section]["path"]
        m["spec"][section]["path"] = str(root / path)
    return parse_job(m)


# ------------------------------------------------------------- the handlers' cluster

ROOT = Path(__file__).resolve().parents[2]
UID = "2b0f3a8e-1c1d-4f7e-9a55-6d2f0b9c7e10"


def job_body(**spec_patch: Any) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((ROOT / "crds/examples/ctr-online.yaml").read_text())
    body["metadata"].update({"uid": UID, "generation": 1})
    body["spec"].update(spec_patch)
    body["status"] = {}
    return body


def _merge(into: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(into.get(k), dict) and k != "scheduler":
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


class FakeKube:
    """Records what the operator asks of the cluster; status patches land in the body,
    as kopf's live body would show them."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.deleted: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.patches: list[dict[str, Any]] = []
        self.pod_states: dict[str, dict[str, tuple[str, int]]] = {"ps": {}, "worker": {}}
        self.fail_next: ApiException | None = None

    def apply(self, obj: Mapping[str, Any]) -> str:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        key = (obj["kind"], obj["metadata"]["name"])
        existed = key in self.objects
        self.objects[key] = copy.deepcopy(dict(obj))
        return "patched" if existed else "created"

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        self.deleted.append((kind, name))
        return self.objects.pop((kind, name), None) is not None

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        self.objects[("StatefulSet", name)]["spec"]["replicas"] = replicas

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.patches.append(copy.deepcopy(dict(status)))
        _merge(self.body.setdefault("status", {}), status)

    def event(self, job: Mapping[str, str], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def pods(self, namespace: str, selector: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        return dict(self.pod_states[selector["streamtrain.io/role"]])

    def replicas(self, role: str) -> int:
        return int(self.objects[("StatefulSet", f"ctr-online-{role}")]["spec"]["replicas"])

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]


@dataclass
class FakeConnection:
    ready_after: int = 0
    attempts: int = 0
    closed: bool = False
    ps: Any = None
    workers: Sequence[Any] = ()

    async def wait_ready(self, timeout: float) -> None:
        self.attempts += 1
        if self.attempts <= self.ready_after:
            raise TimeoutError("ctr-online-ps-0: not ready")

    async def close(self) -> None:
        self.closed = True


class Stop:
    """kopf's daemon stop flag."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def is_set(self) -> bool:
        return self.event.is_set()

    async def wait(self) -> bool:
        await self.event.wait()
        return True


class Memo(dict[str, Any]):
    __getattr__ = dict.get  # type: ignore[assignment]

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def metric(rt: Runtime, name: str, **labels: str) -> float | None:
    return rt.metrics.registry.get_sample_value(name, labels)


# ------------------------------------------------------------ the scheduler's world

PLAN = PassPlan(
    start_day="20261101",
    end_day="20261102",
    passes_per_day=3,
    delta_every=1,
    checkpoint_every=2,
    base=True,
    batch=True,
    export_root="/exp",
    checkpoint_root="/ckpt",
)


@dataclass
class World:
    """Answers the machine's actions; records them; injects late data and worker errors."""

    #: (day, pass) -> time at which its donefiles appear.
    data_at: dict[tuple[str, int], float] = field(default_factory=dict)
    #: (day, pass, worker) -> errors to raise on its next attempts; one starting with
    #: "refused" is a refusal (the worker never started the share).
    worker_errors: dict[tuple[str, int, int], list[str]] = field(default_factory=dict)
    now: float = 0.0
    log: list[Action] = field(default_factory=list)
    #: Every progress the driver would have stored, in order.
    saved: list[Progress] = field(default_factory=list)

    def answer(self, action: Action) -> Event:
        if isinstance(action, CheckData):
            ready = self.now >= self.data_at.get((action.key.day, action.key.pass_index), 0)
            missing = () if ready else (f"/data/{action.key.day}/{action.key.pass_index:02d}00",)
            return DataChecked(missing)
        if isinstance(action, Sleep):
            self.now += action.seconds
            return Done()
        if isinstance(action, RunPass):
            failed = {}
            for w in action.shares:
                errors = self.worker_errors.get((action.key.day, action.key.pass_index, w), [])
                if errors:
                    failed[w] = errors.pop(0)
            if failed:
                refused = frozenset(w for w, e in failed.items() if e.startswith("refused"))
                return PassRan(failed, refused=refused)
            return PassRan({}, {"auc": 0.7, "examples": 100.0})
        return Done()

    def run(self, machine: Scheduler, max_actions: int = 500) -> Terminal:
        """The driver loop, storing progress before and after every action."""
        for _ in range(max_actions):
            action = machine.next_action(self.now)
            self.saved.append(machine.progress)
            if isinstance(action, Terminal):
                return action
            self.log.append(action)
            self.now += 1.0
            machine.handle(self.answer(action), self.now)
            self.saved.append(machine.progress)
        raise AssertionError("the machine did not terminate")


def policy(**kw: object) -> Policy:
    base: dict[str, object] = {
        "num_workers": 2,
        "poll_seconds": 10.0,
        "missing_deadline_seconds": 30.0,
    }
    base.update(kw)
    return Policy(**base)  # type: ignore[arg-type]


def fresh(**kw: object) -> Scheduler:
    return Scheduler(PLAN, policy(**kw), Progress())


def restart(progress: Progress, **kw: object) -> Scheduler:
    """A new machine from the stored record, through its JSON form (as the store does)."""
    stored = json.loads(json.dumps(progress.to_dict()))
    return Scheduler(PLAN, policy(**kw), Progress.from_dict(stored))


def steps(log: list[Action]) -> list[str]:
    out = []
    for a in log:
        if isinstance(a, RunPass):
            out.append(f"{'replay ' if a.replay else ''}train {a.key.day}/{a.key.pass_index}")
        elif isinstance(a, Save):
            out.append(f"{'replay ' if a.replay else ''}{a.key.kind.value} {a.uri}")
        elif isinstance(a, Shrink):
            out.append(f"{'replay ' if a.replay else ''}shrink {a.key.day}")
        elif isinstance(a, LoadCheckpoint):
            out.append(f"load {a.uri}")
        elif isinstance(a, ResetWorkers):
            out.append("reset")
    return out


def crash_at(world: World, predicate: object) -> Progress:
    """The last progress stored before the action matching ``predicate`` completed."""
    for i, action in enumerate(world.log):
        if predicate(action):  # type: ignore[operator]
            # The driver stores progress before (saved[2i]) and after (saved[2i+1]) action i.
            return world.saved[2 * i]
    raise AssertionError("no such action")
