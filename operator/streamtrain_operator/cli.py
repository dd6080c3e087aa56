"""``streamtrain``: run a job locally, show its status, score with an exported model.

- ``streamtrain run job.yaml``: the whole job on this machine (``local/cluster.py``).
- ``streamtrain status job.yaml`` (or ``--state FILE``): phase, position, last metrics.
- ``streamtrain predict ...`` and ``streamtrain synth ...``: run in a separate Python
  process (``python -m streamtrain_worker.predict`` / ``.synth``), because the predictor needs
  torch and this package never imports it.

Where state lives: ``--state`` or, by default, ``<checkpoint.path>/_state/<job>.json`` when
the checkpoint path is local (the progress record sits next to the checkpoints it refers
to), else ``<workdir>/state.json``. ``--workdir`` (default ``.streamtrain/<job>``) holds the
rendered configs and the child processes' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from streamtrain_operator.job.progress import Phase
from streamtrain_operator.job.spec import Job, SpecError, is_local_path, load_job
from streamtrain_operator.local.reporting import format_pass
from streamtrain_operator.local.runner import RunOptions, run_job
from streamtrain_operator.run.hooks import NO_HOOK, StepHook
from streamtrain_operator.run.state import LocalStateFile, StateError
from streamtrain_ps.plumbing.launch import LaunchError

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def default_workdir(job: Job) -> Path:
    return Path(".streamtrain") / job.name


def default_state_path(job: Job, workdir: Path) -> Path:
    ckpt = job.spec.checkpoint.path
    if is_local_path(ckpt):
        return Path(ckpt.removeprefix("file://")) / "_state" / f"{job.name}.json"
    return workdir / "state.json"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamtrain", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a StreamingTrainingJob manifest on this machine")
    run.add_argument("manifest", type=Path)
    run.add_argument("--state", type=Path, help="progress file (default: see --help)")
    run.add_argument("--workdir", type=Path, help="configs and logs (default .streamtrain/<job>)")
    run.add_argument(
        "--start-timeout", type=float, default=120.0, help="seconds for a process to come up"
    )
    status = sub.add_parser("status", help="show a job's progress from its state file")
    status.add_argument("manifest", type=Path, nargs="?")
    status.add_argument("--state", type=Path)
    status.add_argument("--workdir", type=Path)
    status.add_argument("--json", action="store_true", help="print the raw state record")
    sub.add_parser("predict", help="score examples with an exported model", add_help=False)
    sub.add_parser("synth", help="generate a synthetic time-sliced stream", add_help=False)
    return p


def _load(manifest: Path) -> Job:
    try:
        return load_job(manifest)
    except OSError as exc:
        raise SystemExit(f"error: {manifest}: {exc.strerror or exc}") from exc
    except SpecError as exc:
        raise SystemExit(f"error: {manifest}: {exc}") from exc


def _paths(args: argparse.Namespace, job: Job) -> tuple[Path, Path]:
    workdir = args.workdir or default_workdir(job)
    return args.state or default_state_path(job, workdir), workdir


def cmd_run(args: argparse.Namespace, step_hook: StepHook = NO_HOOK) -> int:
    job = _load(args.manifest)
    state, workdir = _paths(args, job)
    options = RunOptions(
        state_path=state, workdir=workdir, start_timeout=args.start_timeout, step_hook=step_hook
    )
    try:
        progress = asyncio.run(run_job(job, options))
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if progress.phase == Phase.SUCCEEDED:
        return 0
    if progress.phase == Phase.FAILED:
        print(f"error: {progress.message}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_INTERRUPTED


def cmd_status(args: argparse.Namespace) -> int:
    if args.state is None and args.manifest is None:
        print("error: give the job manifest or --state FILE", file=sys.stderr)
        return EXIT_USAGE
    if args.manifest is not None:
        job = _load(args.manifest)
        state, _ = _paths(args, job)
        passes_per_day = job.spec.data.passes_per_day
    else:
        state, passes_per_day = args.state, 0
    try:
        progress = LocalStateFile(state).load()
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if progress is None:
        print(f"no progress recorded yet ({state})")
        return 0
    if args.json:
        print(json.dumps(progress.to_dict(), indent=1, sort_keys=True))
        return 0
    d = progress.to_dict()
    print(
        f"phase:           {progress.phase}"
        + (f" ({progress.message})" if progress.message else "")
    )
    print(f"generation:      {progress.generation}")
    for label, key in (
        ("current", "current"),
        ("last completed", "lastCompleted"),
        ("last checkpoint", "lastCheckpoint"),
        ("last export", "lastExport"),
    ):
        value = d[key]
        if value:
            where = f"{value['day']}/{value['pass']} {value['step']}"
            print(f"{label + ':':<17}{where}" + (f" -> {value['uri']}" if "uri" in value else ""))
    print(f"passes trained:  {len(progress.history)}; shrunk days: {len(progress.shrunk_days)}")
    for record in progress.history[-5:]:
        print("  " + format_pass(record, passes_per_day or record.pass_index))
    for cond in progress.conditions:
        if cond.status == "True":
            print(f"condition {cond.type}: {cond.reason}: {cond.message}")
    return 0


def _exec_module(module: str, argv: Sequence[str]) -> int:
    """Replace this process with ``python -m module argv`` (keeps torch out of this one)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])
    return 0  # pragma: no cover - execv does not return


def main(argv: Sequence[str] | None = None, *, step_hook: StepHook = NO_HOOK) -> int:
    """The command line; ``step_hook`` is for ``run`` (``run.hooks``: tests hold a step)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in ("predict", "synth"):
        return _exec_module(f"streamtrain_worker.{args_list[0]}", args_list[1:])
    args = _parser().parse_args(args_list)
    if args.command == "run":
        return cmd_run(args, step_hook)
    return cmd_status(args)


if __name__ == "__main__":
    sys.exit(main())
