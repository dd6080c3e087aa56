"""``make bench-peer``: ours against the peer (PaddlePaddle's PS), alternating, on one box.

The protocol of issue 11's comparison: the Criteo sample as 24 hourly passes of 6,000 rows
(300 rows repeated 20x, laid out as ``bench-e2e`` does), batch 512, 39 slots, 1 + 8 weights a
key plus the 2 CVM columns a slot, MLP 512-256-128, one PS server and one worker on
127.0.0.1. Each round runs three things back to back, in an order reversed every other round
so the load of other processes on the shared cores hits them alike:

- **ours**: ``python -m streamtrain_tools.bench.worker.e2e --json --skip-quality`` (its
  ``train_ex_per_s``, training only, and ``e2e_ex_per_s``, launch to finish with the
  per-pass delta exports and checkpoints it always does);
- **the peer, saves off** and **the peer, saves on**: ``peer/trainer.py`` under the peer's
  interpreter (``--peer-python``, a virtualenv with ``paddlepaddle``; ``make bench-peer``
  creates it), a server and a worker process with the role environment ``fleetrun`` sets.
  Its training-only figure is examples over its training passes' wall time: it excludes
  the loading of each pass into memory and the separate evaluation pass it runs over each
  pass before training on it. Its end-to-end figure is launch of the server until both
  its processes are gone, the server stopped once the worker is done as ``fleetrun`` does
  (start-up, loading, evaluation, training and, with saves on, the per-pass delta model, a
  checkpoint every 6 passes and the day end's shrink, base and batch model).

Reported per side: the median over rounds of each figure, and the ratios ours / peer
(median of the per-round ratios): ``train_ratio`` (the goal: >= 2), ``e2e_ratio_saves_off``
(goal: >= 5) and ``e2e_ratio_saves_on``. So a speed win is not a quality loss, the mean
AUC of passes 13-24 of both sides' throughput runs: ours and the peer's training-pass AUC
(each batch scored before its update, as ours does), and the peer's evaluation-pass AUC
(the pass scored before training on it). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamtrain_ps.plumbing.launch import free_port, launch
from streamtrain_tools.samples import SAMPLES_DIR, lay_out
from streamtrain_worker.metrics import auc_from_histograms

REPO = Path(__file__).resolve().parents[4]
PEER_PYTHON = REPO / ".venv-peer" / "bin" / "python"
TRAINER = Path(__file__).with_name("trainer.py")
DAY = "20261101"
SIDES = ("ours", "peer_saves_off", "peer_saves_on")
#: Seconds a run may take before it is declared hung (a loaded box runs one in minutes).
TIMEOUT = 1800.0


def role_env(role: str, server_port: int, worker_port: int) -> dict[str, str]:
    """The environment ``fleetrun --server_num 1 --worker_num 1`` gives one process of a
    parameter-server job on 127.0.0.1 (``role``: ``PSERVER`` or ``TRAINER``)."""
    if role not in ("PSERVER", "TRAINER"):
        raise ValueError(f"role {role!r}: expected PSERVER or TRAINER")
    env = {
        "TRAINING_ROLE": role,
        "PADDLE_PSERVERS_IP_PORT_LIST": f"127.0.0.1:{server_port}",
        "PADDLE_TRAINER_ENDPOINTS": f"127.0.0.1:{worker_port}",
        "PADDLE_TRAINERS_NUM": "1",
        "POD_IP": "127.0.0.1",
        "PADDLE_PORT": str(server_port if role == "PSERVER" else worker_port),
    }
    if role == "TRAINER":
        env["PADDLE_TRAINER_ID"] = "0"
    return env


def mean_13_24(aucs: Sequence[float | None]) -> float | None:
    """The mean AUC of passes 13-24 (``bench-e2e``'s figure); ``None`` if one is undefined."""
    window = aucs[12:24]
    if len(window) < 12 or any(a is None for a in window):
        return None
    return sum(a for a in window if a is not None) / len(window)


@dataclass(frozen=True)
class PeerRun:
    """One run of the peer: its figures and where its time went."""

    examples: int
    wall_seconds: float
    startup_seconds: float
    step_seconds: dict[str, float]
    train_aucs: list[float | None]
    eval_aucs: list[float | None]

    @classmethod
    def from_result(cls, result: Mapping[str, Any], wall: float, launched: float) -> PeerRun:
        """Read the worker's JSON (``peer/trainer.py``); ``launched`` is the wall-clock time
        the server was started, ``wall`` launch until both processes were gone."""
        passes = result["passes"]
        if not passes:
            raise ValueError("the peer's result holds no pass")
        steps = {
            k: sum(p[f"{k}_seconds"] for p in passes) for k in ("load", "eval", "train", "save")
        }
        steps["day_end"] = result["day_end_seconds"]
        return cls(
            examples=sum(p["examples"] for p in passes),
            wall_seconds=wall,
            startup_seconds=result["first_pass_started"] - launched,
            step_seconds=steps,
            train_aucs=[auc_from_histograms(**p["train_stats"]) for p in passes],
            eval_aucs=[auc_from_histograms(**p["eval_stats"]) for p in passes],
        )

    def figures(self) -> dict[str, Any]:
        """The JSON fields of this run (named like ``bench-e2e``'s)."""
        train_auc = mean_13_24(self.train_aucs)
        eval_auc = mean_13_24(self.eval_aucs)
        return {
            "train_ex_per_s": round(self.examples / self.step_seconds["train"], 1),
            "e2e_ex_per_s": round(self.examples / self.wall_seconds, 1),
            # Launch to finish less its evaluation passes (ours scores each batch inside
            # training instead): how much of the gap the separate evaluation is.
            "e2e_ex_per_s_without_eval": round(
                self.examples / (self.wall_seconds - self.step_seconds["eval"]), 1
            ),
            "examples": self.examples,
            "wall_seconds": round(self.wall_seconds, 2),
            "startup_seconds": round(self.startup_seconds, 2),
            "step_seconds": {k: round(v, 2) for k, v in self.step_seconds.items()},
            "train_auc_mean_13_24": None if train_auc is None else round(train_auc, 4),
            "eval_auc_mean_13_24": None if eval_auc is None else round(eval_auc, 4),
        }


def summarize(rounds: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Medians over rounds of each side's figures and the ours / peer ratios (the median of
    the per-round ratios, so a round's load hits both sides of its ratio alike)."""
    if not rounds:
        raise ValueError("no rounds to summarize")

    def median(side: str, field: str) -> float | None:
        values = [r[side][field] for r in rounds if r[side].get(field) is not None]
        return round(statistics.median(values), 4) if values else None

    def ratio(field: str, peer: str) -> float:
        return round(statistics.median(r["ours"][field] / r[peer][field] for r in rounds), 3)

    fields = ("train_ex_per_s", "e2e_ex_per_s")
    medians = {
        side: {f: median(side, f) for f in fields if median(side, f) is not None} for side in SIDES
    }
    medians["ours"]["auc_mean_13_24"] = median("ours", "throughput_auc_mean_13_24")
    for side in SIDES[1:]:
        for f in (
            "e2e_ex_per_s_without_eval",
            "train_auc_mean_13_24",
            "eval_auc_mean_13_24",
            "startup_seconds",
        ):
            medians[side][f] = median(side, f)
    return {
        "train_ratio": ratio("train_ex_per_s", "peer_saves_off"),
        "train_ratio_saves_on": ratio("train_ex_per_s", "peer_saves_on"),
        "e2e_ratio_saves_off": ratio("e2e_ex_per_s", "peer_saves_off"),
        "e2e_ratio_saves_on": ratio("e2e_ex_per_s", "peer_saves_on"),
        "medians": medians,
    }


def run_peer(
    python: Path, data: Path, work: Path, saves: bool, args: argparse.Namespace
) -> PeerRun:
    """One launch-to-finish run of the peer: a server and a worker process."""
    work.mkdir(parents=True)
    out = work / "result.json"
    cmd = [
        str(python),
        str(TRAINER),
        "--data",
        str(data),
        "--out",
        str(out),
        "--model-dir",
        str(work / "models"),
        "--batch-size",
        str(args.batch_size),
        "--threads",
        str(args.peer_threads),
        *(["--saves"] if saves else []),
    ]
    server_port, worker_port = free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "TRAINING_"))}
    base["PYTHONPATH"] = ""  # the peer's interpreter must not see this repository's packages
    launched = time.time()
    started = time.perf_counter()
    (work / "server.log").unlink(missing_ok=True)
    server = launch(
        "peer-server",
        cmd,
        work / "server.log",
        merge_stderr=True,
        env={**base, **role_env("PSERVER", server_port, worker_port)},
        cwd=work,
    )
    try:
        with (work / "worker.log").open("w") as log:
            code = subprocess.run(
                cmd,
                check=False,
                cwd=work,
                env={**base, **role_env("TRAINER", server_port, worker_port)},
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=TIMEOUT,
            ).returncode
        # The server serves until it is stopped, as ``fleetrun`` stops it once the
        # workers are done: launch to finish ends when both processes are gone.
        server.stop(grace=60)
        wall = time.perf_counter() - started
    finally:
        server.kill()
        server.process.wait()
    if code != 0 or not out.exists():
        tail = (work / "worker.log").read_text().splitlines()[-20:]
        raise RuntimeError(f"the peer's worker exited {code}:\n" + "\n".join(tail))
    return PeerRun.from_result(json.loads(out.read_text()), wall, launched)


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    """``bench-e2e``'s throughput run in its own process; its JSON line."""
    cmd = [sys.executable, "-m", "streamtrain_tools.bench.worker.e2e", "--json", "--skip-quality"]
    cmd += ["--batch-size", str(args.batch_size), "--repeat", str(args.repeat)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"bench-e2e exited {done.returncode}:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def one_round(
    index: int, python: Path, data: Path, tmp: Path, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """The three sides back to back, reversed on odd rounds."""
    order = SIDES if index % 2 == 0 else SIDES[::-1]
    results: dict[str, dict[str, Any]] = {}
    for side in order:
        if side == "ours":
            results[side] = run_ours(args)
        else:
            saves = side == "peer_saves_on"
            run = run_peer(python, data, tmp / f"round{index}-{side}", saves, args)
            results[side] = run.figures()
        r = results[side]
        print(
            f"round {index + 1} {side}: training {r['train_ex_per_s']:,.0f} ex/s, "
            f"end to end {r['e2e_ex_per_s']:,.0f} ex/s",
            flush=True,
        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamtrain_tools.bench.peer", description=__doc__)
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--repeat", type=int, default=20, help="copies of each pass's 300 rows")
    p.add_argument("--peer-threads", type=int, default=1, help="the peer worker's threads")
    p.add_argument("--peer-python", type=Path, default=PEER_PYTHON)
    p.add_argument("--data", type=Path, default=SAMPLES_DIR, help="folder of the samples")
    args = p.parse_args(argv)
    # absolute, not resolved: the venv's interpreter is a symlink that must stay one
    args.peer_python = args.peer_python.absolute()
    if not args.peer_python.exists():
        raise SystemExit(f"{args.peer_python}: no peer interpreter (`make bench-peer` makes it)")
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="streamtrain-bench-peer-") as name:
        tmp = Path(name)
        lay_out("criteo", tmp / "data", data_dir=args.data, start_day=DAY, repeat=args.repeat)
        for index in range(args.rounds):
            rounds.append(one_round(index, args.peer_python, tmp / "data", tmp, args))
    summary = summarize(rounds)
    print(
        f"ours / peer: training {summary['train_ratio']:.2f}x (goal 2x), end to end "
        f"{summary['e2e_ratio_saves_off']:.2f}x with its saves off (goal 5x), "
        f"{summary['e2e_ratio_saves_on']:.2f}x with its saves on"
    )
    result = {
        **summary,
        "rounds": rounds,
        "peer_version": peer_version(args.peer_python),
        "batch_size": args.batch_size,
        "rows_per_pass": 300 * args.repeat,
        "peer_threads": args.peer_threads,
    }
    print(json.dumps(result))
    return 0


def peer_version(python: Path) -> str:
    """``paddle.__version__`` under the peer's interpreter."""
    done = subprocess.run(
        [str(python), "-c", "import paddle; print(paddle.__version__)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    sys.exit(main())
