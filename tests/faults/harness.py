"""Shared machinery of the fault-injection suite: a tiny stream, a job, ``streamtrain run``.

Every case runs the real CLI as a subprocess (PS and workers are its children) on a
synthetic stream of a few hundred rows per folder, injects one fault, and asserts the
outcome from the state file, the export donefile, the checkpoints and the CLI output.
Waiting is always polling with a deadline; the pause hook (``pause.PauseHook``, armed by
``STREAMTRAIN_PAUSE`` and injected by the test entry points ``faults.run_cli`` and
``faults.operator_main``) holds a run at an exact step when a step is too short to hit by
polling.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from streams import START, write_stream
from streamtrain_operator.job import checkpoints
from streamtrain_operator.job.checkpoints import CheckpointName
from streamtrain_operator.job.plan import StepKind
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_ps.plumbing.launch import launch, python_argv
from streamtrain_ps.saves import checkpoint

#: The folder holding the ``faults`` package: the test entry points' subprocesses import it.
TESTS_ROOT = Path(__file__).resolve().parents[1]
NAME = "faults"
SLOTS = ["user", "item", "category", "device", "position", "hour", "hist"]
#: Overrides for a job whose final checkpoint is bit-reproducible (one worker, one thread,
#: no overlap of passes), so "once" can be checked on the model itself against a clean run;
#: checkpoints every other pass, so a rerun replays a pass from the one before.
DETERMINISTIC: dict[str, Any] = {
    "workers": {"replicas": 1, "numThreads": 1, "overlap": False},
    "checkpoint": {"path": "ckpt", "everyPasses": 2},
}
#: The models a one-day job over :func:`write_stream` publishes, in donefile order: a delta
#: per pass, the next day's base, the day's batch model.
ONE_DAY_MODELS = [f"{START}/delta-{p}" for p in (1, 2, 3, 4)] + ["20261102/base", f"{START}/batch"]


def manifest(days: int = 1, **overrides: Any) -> dict[str, Any]:
    """A tiny job (1 PS, 1 worker, small MLP) over ``data``; ``overrides`` update a section."""
    spec: dict[str, Any] = {
        "data": {
            "path": "data",
            "format": "slot",
            "slots": SLOTS,
            "labelSlot": "click",
            "startDay": START,
            "endDay": f"{int(START) + days - 1}",
            "splitIntervalMinutes": 360,
            "pollSeconds": 0.1,
        },
        "model": {"hiddenUnits": [8], "batchSize": 32, "denseSyncSteps": 1},
        "sparse": {"embedxThreshold": 1, "baseThreshold": 0, "deltaThreshold": 0},
        "ps": {"replicas": 1, "logicalShards": 4},
        "workers": {"replicas": 1, "passRetries": 2},
        "checkpoint": {"path": "ckpt", "everyPasses": 1},
        "export": {"path": "export", "retries": 1, "retryBackoffSeconds": 0.05},
        "seed": 7,
    }
    for section, values in overrides.items():
        if isinstance(values, dict):
            spec.setdefault(section, {}).update(values)
        else:
            spec[section] = values
    return {
        "apiVersion": "streamtrain.io/v1alpha1",
        "kind": "StreamingTrainingJob",
        "metadata": {"name": NAME},
        "spec": spec,
    }


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)  # polling interval, not synchronisation


def start_logged(
    module_args: list[str],
    *,
    cwd: Path,
    log: Path,
    env: dict[str, str],
    pause: str | None,
    pause_file: Path,
) -> subprocess.Popen[str]:
    """``python -m <module_args>`` in the background (``streamtrain_ps.plumbing.launch``), as the
    fault tests start a scheduler or an operator (through ``faults.run_cli`` /
    ``faults.operator_main``, so ``tests`` is put on its ``PYTHONPATH``): in ``cwd``, its
    output to ``log``, no stdin, and the pause hook armed at ``pause`` (``after:train@1``
    ...; it writes ``pause_file`` when it holds) or disarmed — a ``STREAMTRAIN_PAUSE``
    inherited from the test's environment would hold a run that nobody releases."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_ROOT), env.get("PYTHONPATH")) if p)
    env.pop("STREAMTRAIN_PAUSE", None)
    if pause is not None:
        env["STREAMTRAIN_PAUSE"] = pause
        env["STREAMTRAIN_PAUSE_FILE"] = str(pause_file)
    return launch(log.stem, python_argv(["-m", *module_args]), log, env=env, cwd=cwd).process


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(c) for c in path.read_text().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class Run:
    """One ``streamtrain run`` subprocess; its output goes to a file (a pipe could fill)."""

    process: subprocess.Popen[str]
    log: Path
    seen_children: set[int] = field(default_factory=set)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def role_pids(self, module: str) -> list[int]:
        """Live children running ``python -m module`` (PS: streamtrain_ps), in start order."""
        pids = []
        for child in children(self.process.pid):
            self.seen_children.add(child)
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if module.encode() in cmdline and alive(child):
                pids.append(child)
        return pids

    def check_running(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"run exited early ({self.process.returncode}):\n{self.output}")

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"run did not finish in {timeout}s:\n{self.output}") from exc

    def kill(self) -> None:
        """SIGKILL the scheduler; its PS and workers die with it (PR_SET_PDEATHSIG)."""
        self.role_pids("streamtrain")  # remember the children before they go
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def kill_and_wait_children(self, timeout: float = 30) -> None:
        """:meth:`kill`, then check that its PS and workers (it had some) exit too: nothing
        of the killed run may be left to interfere with the rerun."""
        self.kill()
        assert self.seen_children, f"the killed run had no PS or worker:\n{self.output}"
        wait_for(
            lambda: not any(alive(pid) for pid in self.seen_children), timeout, "orphans to exit"
        )


class Job:
    """A job directory: stream, manifest, state file, export and checkpoints."""

    def __init__(self, root: Path, runs: list[Run]) -> None:
        self.root = root
        self.path = root / "job.yaml"
        self.state_path = root / "ckpt" / "_state" / f"{NAME}.json"
        self.pause_file = root / "paused"
        self._runs = runs

    def write(self, days: int = 1, rows_per_folder: int = 120, **overrides: Any) -> Job:
        write_stream(self.root, days=days, rows_per_folder=rows_per_folder)
        return self.configure(days, **overrides)

    def configure(self, days: int = 1, **overrides: Any) -> Job:
        self.path.write_text(yaml.safe_dump(manifest(days, **overrides)))
        return self

    def start(self, pause: str | None = None) -> Run:
        """``streamtrain run job.yaml`` in the background (``pause``: ``before:shrink`` ...)."""
        log = self.root / f"run-{len(self._runs)}.log"
        process = start_logged(
            ["faults.run_cli", "run", str(self.path)],
            cwd=self.root,
            log=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            pause=pause,
            pause_file=self.pause_file,
        )
        run = Run(process, log)
        self._runs.append(run)
        return run

    def run(self, timeout: float = 120) -> tuple[int, str]:
        """Run to the end; exit code and output."""
        run = self.start()
        code = run.wait(timeout)
        return code, run.output

    def state(self) -> Progress | None:
        try:
            return Progress.from_dict(json.loads(self.state_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def wait_state(
        self, run: Run, predicate: Callable[[Progress], bool], what: str, timeout: float = 90
    ) -> Progress:
        """Poll the state file until ``predicate`` holds (failing early if the run exits)."""
        found: list[Progress] = []

        def check() -> bool:
            run.check_running()
            run.role_pids("streamtrain")  # remembered for the orphan check at teardown
            p = self.state()
            if p is not None and predicate(p):
                found.append(p)
                return True
            return False

        wait_for(check, timeout, what)
        return found[0]

    def wait_training(self, run: Run, pass_index: int) -> Progress:
        """Wait until the run is training pass ``pass_index`` (a kill now lands inside it)."""
        return self.wait_state(
            run,
            lambda p: (
                p.current is not None
                and (p.current.kind, p.current.pass_index) == (StepKind.TRAIN, pass_index)
                and p.phase == Phase.TRAINING
            ),
            f"pass {pass_index} to start training",
        )

    def enlarge(self, folder: str, times: int) -> None:
        """Repeat every part file of ``folder`` (relative to the root) ``times`` over, so
        that pass is much longer than the others and a fault injected in it lands inside."""
        for part in (self.root / folder).glob("part-*"):
            part.write_text(part.read_text() * times)

    def wait_paused(self, run: Run, timeout: float = 90) -> str:
        """Wait for the pause hook to hold; what it holds at (``before shrink 20261101/4``)."""

        def check() -> bool:
            run.check_running()
            run.role_pids("streamtrain")
            return self.pause_file.exists() and self.pause_file.read_text().endswith("\n")

        wait_for(check, timeout, f"the run to pause ({self.pause_file})")
        return self.pause_file.read_text().strip()

    def release(self) -> None:
        self.pause_file.unlink()


def reap(runs: list[Run]) -> None:
    """Finalizer: kill every run still going and check none of its children survive."""
    for run in runs:
        if run.process.poll() is None:
            run.kill()
    survivors: list[int] = []

    def all_gone() -> bool:
        survivors[:] = [pid for run in runs for pid in run.seen_children if alive(pid)]
        return not survivors

    try:
        wait_for(all_gone, 30, "the runs' PS and worker processes to exit")
    finally:
        for pid in survivors:  # never leave an orphan, even when the check fails
            os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class ModelState:
    """A mode 0 checkpoint read back: every sparse row by key, and the dense vectors."""

    columns: tuple[str, ...]
    keys: npt.NDArray[np.uint64]  # sorted
    rows: npt.NDArray[np.float32]  # rows[i] belongs to keys[i]
    #: Every array of every dense vector (values and optimizer moments) by "name/array",
    #: plus the optimizer step count as "name/step".
    dense: dict[str, npt.NDArray[Any]]

    def column(self, name: str) -> npt.NDArray[np.float32]:
        return self.rows[:, self.columns.index(name)]


@dataclass(frozen=True)
class Reference:
    """The :data:`DETERMINISTIC` one-day job run without a fault: its final checkpoint and
    its export root, what a faulted run's outcome must equal."""

    model: ModelState
    export: Path


def read_sparse_table(
    manifest: checkpoint.Manifest, table: str = "embedding"
) -> tuple[tuple[str, ...], npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
    """Every row of ``table`` in a checkpoint (checksums verified): its columns, the keys
    sorted, and the rows in key order (a save's row order follows its shards' layout)."""
    keys, rows, columns = [], [], ()
    for logical in range(manifest.logical_shards):
        header, arrays = checkpoint.read_verified(manifest, manifest.sparse_part(table, logical))
        columns = tuple(header["columns"])
        keys.append(arrays["keys"])
        rows.append(arrays["values"].reshape(-1, len(columns)))
    all_keys, all_rows = np.concatenate(keys), np.concatenate(rows)
    order = np.argsort(all_keys, kind="stable")
    return columns, all_keys[order], all_rows[order]


def read_checkpoint(uri: str | Path, table: str = "embedding") -> ModelState:
    """All keys of ``table`` and all dense vectors of the checkpoint at ``uri`` (verified)."""
    manifest = checkpoint.read_manifest(str(uri))
    columns, keys, rows = read_sparse_table(manifest, table)
    dense: dict[str, npt.NDArray[Any]] = {}
    for name, info in manifest.dense.items():
        header, arrays = checkpoint.read_verified(manifest, manifest.files[info["path"]])
        dense.update({f"{name}/{a}": v for a, v in arrays.items()})
        dense[f"{name}/step"] = np.array([header["step"]])
    return ModelState(columns, keys, rows, dense)


def assert_same_model(got: ModelState, want: ModelState) -> None:
    """``got`` is bit-identical to ``want`` (NaN-safe): every sparse key and row, every
    dense array. A pass trained twice or a second shrink would change some of them."""
    assert got.keys.tobytes() == want.keys.tobytes(), (
        f"sparse keys differ: {len(got.keys)} vs {len(want.keys)} keys"
    )
    assert got.rows.tobytes() == want.rows.tobytes(), "sparse rows differ"
    assert got.dense.keys() == want.dense.keys(), (
        f"dense arrays differ: {sorted(got.dense)} vs {sorted(want.dense)}"
    )
    differ = sorted(k for k, v in want.dense.items() if got.dense[k].tobytes() != v.tobytes())
    assert not differ, f"dense arrays differ: {differ}"


def checkpoint_of(root: Path, day: str, pass_index: int) -> Path:
    """The newest checkpoint directory of ``day``/``pass_index`` (highest generation)."""
    names = [CheckpointName.parse(str(p)) for p in (root / "ckpt").glob(checkpoints.GLOB)]
    found = sorted(n for n in names if (n.day, n.pass_index) == (day, pass_index))
    if not found:
        raise AssertionError(f"no checkpoint of {day}/{pass_index} under {root / 'ckpt'}")
    return root / "ckpt" / found[-1].path


def data_totals(folder: Path, label_slot: str = "click") -> tuple[int, int]:
    """Examples and positive labels in the part files of ``folder`` (slot format)."""
    examples = positives = 0
    for part in sorted(folder.glob("part-*")):
        for line in part.read_text().splitlines():
            examples += 1
            positives += f"1:{label_slot}" in line.split() or f"{label_slot}:1" in line.split()
    return examples, positives
