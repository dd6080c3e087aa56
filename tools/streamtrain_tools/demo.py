"""``make demo``: a two-day streaming job on this machine, from nothing, in a few minutes.

1. Generates a synthetic click stream (``streamtrain_worker.data.synth``: Zipf features, daily
   drift, a known logistic model, so the best reachable AUC of every pass is known) as
   3-hourly folders; the donefiles arrive one by one with a delay, like a real log pipeline,
   so the job is seen waiting for data.
2. Runs the job with ``streamtrain run`` semantics (1 PS shard, 2 workers as local
   processes): test-then-train pass by pass, a delta model after every pass, checkpoints,
   and at each day end shrink, a base model for the next day and the batch model.
3. Prints learned AUC against the oracle per pass, the published models, a serving check
   (the last pass's data scored by the model published before it, as serving would have,
   next to what training reported), every pass scored by the model published before it
   (its COPC: how calibrated the models a server picks up one after another are), and the
   commands to look further (status, predict).
4. Writes ``report.html`` (``streamtrain report``: plots of every pass) and prints its path.

Everything lands in ``demo-run/`` (removed first, so every demo starts fresh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.local.passlog import FILE_NAME
from streamtrain_operator.local.report import write_report
from streamtrain_operator.local.reporting import metric
from streamtrain_operator.local.runner import RunOptions, run_job
from streamtrain_operator.run.export import read_donefile
from streamtrain_worker.data.synth import SEQUENCE_SLOT, SLOTS, SynthConfig, generate_delayed
from streamtrain_worker.metrics import COPC_BAND
from streamtrain_worker.publishing.model_folder import ModelKind, model_key

START = "20261101"


def demo_manifest(days: int) -> dict[str, Any]:
    """The demo job (paths relative to the manifest, which sits in the demo directory)."""
    end = f"{int(START) + days - 1}"
    return {
        "apiVersion": "streamtrain.io/v1alpha1",
        "kind": "StreamingTrainingJob",
        "metadata": {"name": "demo"},
        "spec": {
            "data": {
                "path": "data",
                "format": "slot",
                "slots": list(SLOTS),
                "labelSlot": "click",
                "sequenceSlot": SEQUENCE_SLOT,
                # The demo's stream has no user-group x item-group term: crossed slots
                # cost its day 2 and the served model's calibration (docs/decisions.md).
                "crosses": [],
                "startDay": START,
                "endDay": end,
                "splitIntervalMinutes": 180,
                "splitsPerPass": 2,
                "pollSeconds": 0.5,
                "missingDeadlineSeconds": 3,
            },
            "model": {"type": "slot_dnn", "hiddenUnits": [64, 32], "batchSize": 256},
            "sparse": {"embedxThreshold": 2, "baseThreshold": 1, "deltaThreshold": 0.25},
            "ps": {"replicas": 1, "logicalShards": 16},
            "workers": {"replicas": 2},
            "checkpoint": {"path": "checkpoints", "everyPasses": 2},
            "export": {"path": "models", "deltaEveryPasses": 1},
        },
    }


def serving_check(root: Path, progress: Progress, folders: Sequence[str], out: Any) -> None:
    """Score the last pass's folders with the model published just before that pass — what
    a server would have answered with while the data arrived — and print it next to the
    pass's progressive metrics from training. The predictor runs in its own process (it
    needs torch, which the operator never imports)."""
    if not progress.history or progress.history[-1].pass_index < 2:
        return
    last = progress.history[-1]
    key = model_key(ModelKind.DELTA, last.day, last.pass_index - 1)
    files = sorted(str(f) for folder in folders for f in Path(folder).glob("part-*"))
    command = [sys.executable, "-m", "streamtrain_worker.publishing.predict", "--json"]
    command += ["--export", str(root / "models"), "--model", key, *files]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"\n== serving check failed: {done.stderr.strip()}", file=out)
        return
    served = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n== serving check: {key} scores the data of pass {last.pass_index}", file=out)
    served_auc, served_copc = metric(served, "auc"), metric(served, "copc", ".3f")
    print(f"   served model           auc {served_auc}  copc {served_copc}", file=out)
    print(
        f"   training (progressive) auc {metric(last.metrics, 'auc')}"
        f"  copc {metric(last.metrics, 'copc', '.3f')}",
        file=out,
    )


def next_pass_check(
    root: Path, progress: Progress, pass_folders: Sequence[Sequence[str]], out: Any
) -> None:
    """Score every pass after the first with the delta published after the pass before it —
    the model a server held while that pass's data arrived — and print each COPC and how
    many fall in ``COPC_BAND``. ``pass_folders``: the folders of every pass, in order."""
    from streamtrain_worker.publishing.predict import load_model, score  # torch: late

    history = progress.history
    pairs = list(zip(history, history[1:], pass_folders[1:], strict=False))
    if not pairs:
        return
    print(
        "\n== next pass: each pass scored by the model published after the pass before it",
        file=out,
    )
    within = 0
    for before, scored, folders in pairs:
        key = model_key(ModelKind.DELTA, before.day, before.pass_index)
        files = sorted(str(f) for folder in folders for f in Path(folder).glob("part-*"))
        copc = score(load_model(str(root / "models"), key), files).copc
        if copc is not None and COPC_BAND[0] <= copc <= COPC_BAND[1]:
            within += 1
        shown = "n/a" if copc is None else f"{copc:.3f}"
        print(f"   {scored.day} pass {scored.pass_index} by {key}: copc {shown}", file=out)
    low, high = COPC_BAND
    print(f"   {within} of {len(pairs)} passes with a COPC in {low}-{high}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamtrain_tools.demo", description=__doc__)
    p.add_argument("--dir", type=Path, default=Path("demo-run"))
    p.add_argument("--days", type=int, default=2)
    p.add_argument("--rows-per-folder", type=int, default=4000)
    p.add_argument("--donefile-delay", type=float, default=2.0, help="seconds between donefiles")
    args = p.parse_args(argv)
    out = sys.stdout
    root: Path = args.dir.resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    manifest_path = root / "job.yaml"
    manifest_path.write_text(yaml.safe_dump(demo_manifest(args.days), sort_keys=False))
    print(f"== streamtrain demo in {root}", file=out)
    print(f"   job manifest: {manifest_path}", file=out)
    cfg = SynthConfig(
        out=str(root / "data"),
        days=args.days,
        start=START,
        split_interval_minutes=180,
        splits_per_pass=2,
        rows_per_folder=args.rows_per_folder,
        files_per_folder=2,
        seed=1,
    )
    synth, writer = generate_delayed(cfg, args.donefile_delay)
    print(
        f"== generated {len(synth.folders)} folders x {cfg.rows_per_folder} rows "
        f"({args.days} days, 8 folders/day, 2 folders/pass); their donefiles arrive one every "
        f"{args.donefile_delay:g}s",
        file=out,
    )
    job = load_job(manifest_path)
    try:
        progress = asyncio.run(
            run_job(job, RunOptions(root / "state.json", root / "work", out=out))
        )
    finally:
        writer.stop()
    if progress.phase == Phase.FAILED:
        print(f"error: {progress.message}", file=sys.stderr)
    oracle = {(o.day, o.pass_index): o.oracle_auc for o in synth.passes}
    print("\n== learned AUC (progressive validation) against the generator's oracle", file=out)
    for r in progress.history:
        best = oracle.get((r.day, r.pass_index), float("nan"))
        print(
            f"   {r.day} pass {r.pass_index}: auc {metric(r.metrics, 'auc')}  oracle {best:.4f}"
            f"  waited {r.wait_seconds:.1f}s",
            file=out,
        )
    models = read_donefile(str(root / "models"))
    print(f"\n== {len(models)} models published in {root / 'models'} (donefile.txt):", file=out)
    print("   " + "  ".join(d.key for d in models), file=out)
    print(f"   days shrunk: {', '.join(progress.shrunk_days)}", file=out)
    serving_check(root, progress, synth.folders[-2:], out)
    per_pass = cfg.splits_per_pass
    folders = [synth.folders[i : i + per_pass] for i in range(0, len(synth.folders), per_pass)]
    next_pass_check(root, progress, folders, out)
    last_folder = synth.folders[-1]
    print("\n== look further:", file=out)
    print(
        f"   .venv/bin/streamtrain status {manifest_path} --state {root / 'state.json'}", file=out
    )
    print(
        f"   .venv/bin/streamtrain predict --export {root / 'models'} {last_folder}/part-*",
        file=out,
    )
    from streamtrain_worker.serving.server import show_one_request  # torch: imported late

    show_one_request(str(root / "models"), sorted(Path(last_folder).glob("part-*"))[0], out)
    (root / "summary.json").write_text(
        json.dumps({"phase": progress.phase, "passes": len(progress.history)}, indent=1)
    )
    report = root / "report.html"
    write_report(root / "work" / FILE_NAME, report, title="streamtrain demo")
    print(f"\n== report with plots of every pass: {report}", file=out)
    print(f"   per-pass metrics: {root / 'work' / FILE_NAME}", file=out)
    return 0 if progress.phase == Phase.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
