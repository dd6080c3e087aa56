"""A synthetic click stream with a known model, so learned AUC can be compared to the best.

``python -m streamtrain_worker.data.synth --out DIR --days D --start 20261101 ...`` writes the
time-sliced layout ``DIR/<YYYYMMDD>/<HHMM>/part-NNNNN`` in the PaddleRec slot format (one
example per line: ``click:<0|1>`` then ``<id>:<slot>`` tokens; ids are the raw integer feature
ids, which the data layer salts with the slot), a donefile per folder, and:

- ``DIR/oracle.json``: per pass, the AUC of the generator's own click probabilities on the
  sampled labels (the best AUC any model can reach on that pass), rows and CTR;
- ``DIR/data.json``: the ``DataConfig`` JSON that reads this stream.

The model: ``logit = base_logit + w_user + w_item + w_category + w_device + w_position + w_hour +
interest · match + affinity[user group, item group]``, where ``match`` is the fraction of the
user's behaviour sequence (slot ``hist``, 3–12 items, mostly from the user's favourite
category, in order) that shares the target item's category — an interaction that DIN's
attention can pick up — and ``affinity`` is a ``num_groups x num_groups`` table over hidden
user and item groups (``num_groups`` 0: no such term): an interaction no single id carries,
which a model learns through the ids' embeddings (a factorisation) or per user-item pair (a
linear learner's quadratic features). Users and items are Zipf-distributed over popularity
ranks, so most ids are rare. Every day a fraction of the ranks is taken over by
brand-new ids with fresh weights, and all weights drift (AR(1)), so a stale model degrades.

``donefile_delay_seconds`` holds each folder's donefile back (written in folder order by a
background thread, one every ``delay`` seconds) so a demo shows the job waiting for data.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import fsspec
import numpy as np
import numpy.typing as npt

from streamtrain_worker.data import timeslices

SLOTS = ("user", "item", "category", "device", "position", "hour", "hist")
SEQUENCE_SLOT = SLOTS.index("hist")
TARGET_SLOT = SLOTS.index("item")
LABEL_SLOT = "click"
NUM_CATEGORIES = 20


@dataclass(frozen=True)
class SynthConfig:
    """What to generate; every field has a CLI flag of the same name (dashes for _)."""

    out: str
    days: int = 2
    start: str = "20261101"
    split_interval_minutes: int = 60
    splits_per_pass: int = 1
    rows_per_folder: int = 1000
    files_per_folder: int = 2
    seed: int = 0
    donefile: str = "_SUCCESS"
    num_users: int = 20_000
    num_items: int = 5_000
    #: Fraction of user and item popularity ranks taken over by new ids each day.
    new_feature_fraction: float = 0.05
    #: Day-to-day AR(1) correlation of every weight (1.0: no drift).
    weight_persistence: float = 0.9
    #: Hidden user and item groups of the ``affinity`` interaction (0: no interaction).
    num_groups: int = 0
    #: Standard deviation of the ``affinity`` table's entries.
    group_strength: float = 1.0
    #: Standard deviation of a per-hour-of-day logit offset drawn once (0: the mild sine
    #: of old). 1.0 moves the click rate e.g. from 9 % to 41 % between adjacent hours: a
    #: context feature constant within a pass with a strong per-value effect.
    hour_strength: float = 0.0
    #: The logit's constant: sets the base click rate (-2.2: ~20 %; -4.3: ~3 %).
    base_logit: float = -2.2


@dataclass(frozen=True)
class PassOracle:
    day: str
    pass_index: int
    rows: int
    positives: int
    oracle_auc: float


@dataclass
class SynthResult:
    """Folders written (in time order) and the oracle per pass."""

    folders: list[str] = field(default_factory=list)
    passes: list[PassOracle] = field(default_factory=list)


def auc(scores: npt.NDArray[np.float64], labels: npt.NDArray[np.int64]) -> float:
    """Exact ROC AUC (Mann–Whitney with tied scores counted half); 0.5 without both classes."""
    pos = int(labels.sum())
    neg = int(labels.shape[0]) - pos
    if pos == 0 or neg == 0:
        return 0.5
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    average_rank = upper - (counts - 1) / 2.0
    rank_sum = float(average_rank[inverse][labels == 1].sum())
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


class _World:
    """The generator's hidden state: popularity ranks → ids, and per-id weights."""

    def __init__(self, cfg: SynthConfig, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.rng = rng
        extra = int(cfg.days * cfg.new_feature_fraction * max(cfg.num_users, cfg.num_items)) + 1
        self.user_ids = np.arange(cfg.num_users)
        self.item_ids = np.arange(cfg.num_items)
        self.next_user, self.next_item = cfg.num_users, cfg.num_items
        self.w_user = rng.normal(0.0, 0.6, cfg.num_users + extra)
        self.w_item = rng.normal(0.0, 0.8, cfg.num_items + extra)
        self.user_pref = rng.integers(0, NUM_CATEGORIES, cfg.num_users + extra)
        self.item_cat = rng.integers(0, NUM_CATEGORIES, cfg.num_items + extra)
        self.w_cat = rng.normal(0.0, 0.4, NUM_CATEGORIES)
        self.w_device = rng.normal(0.0, 0.3, 50)
        self.w_position = -0.25 * np.arange(8)
        self.interest = 1.5
        self.bias = cfg.base_logit
        self.p_user = _zipf(cfg.num_users, 1.05)
        # Drawn only when asked for, so the streams of num_groups 0 stay what they were.
        self.user_group = np.zeros(cfg.num_users + extra, dtype=np.int64)
        self.item_group = np.zeros(cfg.num_items + extra, dtype=np.int64)
        self.affinity = np.zeros((1, 1))
        if cfg.num_groups:
            self.user_group = rng.integers(0, cfg.num_groups, cfg.num_users + extra)
            self.item_group = rng.integers(0, cfg.num_groups, cfg.num_items + extra)
            self.affinity = rng.normal(0.0, cfg.group_strength, (cfg.num_groups, cfg.num_groups))
        self.p_item = _zipf(cfg.num_items, 1.15)
        self.w_hour = 0.3 * np.sin(2 * np.pi * np.arange(24) / 24.0)
        if cfg.hour_strength:  # drawn last, so the streams without it stay what they were
            self.w_hour = rng.normal(0.0, cfg.hour_strength, 24)

    def new_day(self) -> None:
        """Drift: replace a fraction of ranks by new ids; every weight moves (AR(1))."""
        rho = self.cfg.weight_persistence
        noise = np.sqrt(max(0.0, 1.0 - rho * rho))
        for w, sigma in ((self.w_user, 0.6), (self.w_item, 0.8), (self.w_cat, 0.4)):
            w[:] = rho * w + noise * sigma * self.rng.standard_normal(w.shape[0])
        for ids, attr in ((self.user_ids, "next_user"), (self.item_ids, "next_item")):
            count = int(self.cfg.new_feature_fraction * ids.shape[0])
            ranks = self.rng.choice(ids.shape[0], size=count, replace=False)
            start = getattr(self, attr)
            ids[ranks] = np.arange(start, start + count)
            setattr(self, attr, start + count)

    def sample(
        self, n: int, hour: int
    ) -> tuple[
        dict[str, npt.NDArray[np.int64]], list[npt.NDArray[np.int64]], npt.NDArray[np.float64]
    ]:
        """``n`` examples of one folder: single-valued slots, history lists, true p(click)."""
        rng = self.rng
        users = self.user_ids[rng.choice(self.user_ids.shape[0], n, p=self.p_user)]
        items = self.item_ids[rng.choice(self.item_ids.shape[0], n, p=self.p_item)]
        device = rng.integers(0, 50, n)
        position = np.minimum(rng.geometric(0.35, n) - 1, 7)
        lengths = rng.integers(3, 13, n)
        # History: items drawn by popularity, 80% of them from the user's favourite category.
        pool_cats = self.item_cat[self.item_ids]
        hist_flat = self.item_ids[
            rng.choice(self.item_ids.shape[0], int(lengths.sum()), p=self.p_item)
        ]
        owner = np.repeat(np.arange(n), lengths)
        favourite = rng.random(hist_flat.shape[0]) < 0.8
        for c in range(NUM_CATEGORIES):
            pick = favourite & (self.user_pref[users[owner]] == c)
            members = np.flatnonzero(pool_cats == c)
            if pick.any() and members.size:
                weights = self.p_item[members] / self.p_item[members].sum()
                hist_flat[pick] = self.item_ids[
                    members[rng.choice(members.size, int(pick.sum()), p=weights)]
                ]
        same = (self.item_cat[hist_flat] == self.item_cat[items][owner]).astype(np.float64)
        match = np.bincount(owner, weights=same, minlength=n) / lengths
        logit = (
            self.bias
            + self.w_user[users]
            + self.w_item[items]
            + self.w_cat[self.item_cat[items]]
            + self.w_device[device]
            + self.w_position[position]
            + self.w_hour[hour]
            + self.interest * match
            + self.affinity[self.user_group[users], self.item_group[items]]
        )
        columns = {
            "user": users,
            "item": items,
            "category": self.item_cat[items],
            "device": device,
            "position": position,
            "hour": np.full(n, hour),
        }
        hist = np.split(hist_flat, np.cumsum(lengths)[:-1])
        return columns, hist, 1.0 / (1.0 + np.exp(-logit))


def _zipf(size: int, exponent: float) -> npt.NDArray[np.float64]:
    p = 1.0 / np.arange(1, size + 1) ** exponent
    result: npt.NDArray[np.float64] = p / p.sum()
    return result


def _lines(
    columns: dict[str, npt.NDArray[np.int64]],
    hist: list[npt.NDArray[np.int64]],
    labels: npt.NDArray[np.int64],
) -> list[str]:
    singles = [[f"{v}:{name}" for v in columns[name].tolist()] for name in SLOTS if name in columns]
    out = []
    for i, label in enumerate(labels.tolist()):
        tokens = [f"{LABEL_SLOT}:{label}", *(col[i] for col in singles)]
        tokens.extend(f"{v}:hist" for v in hist[i].tolist())
        out.append(" ".join(tokens))
    return out


def data_config(cfg: SynthConfig) -> dict[str, object]:
    """The ``DataConfig`` JSON that reads the generated stream."""
    last = timeslices.format_day(timeslices.parse_day(cfg.start) + dt.timedelta(days=cfg.days - 1))
    return {
        "path": cfg.out,
        "format": "slot",
        "slots": list(SLOTS),
        "labelSlot": LABEL_SLOT,
        "sequenceSlot": SEQUENCE_SLOT,
        "startDay": cfg.start,
        "endDay": last,
        "splitIntervalMinutes": cfg.split_interval_minutes,
        "splitsPerPass": cfg.splits_per_pass,
        "donefile": cfg.donefile,
    }


def generate(cfg: SynthConfig) -> SynthResult:
    """Write the stream (donefiles too when ``write_donefiles``), ``oracle.json``, ``data.json``."""
    return _generate(cfg, write_donefiles=True)


def _generate(cfg: SynthConfig, write_donefiles: bool) -> SynthResult:
    if cfg.days < 1 or cfg.rows_per_folder < 0 or cfg.files_per_folder < 1:
        raise ValueError("days and files_per_folder must be >= 1, rows_per_folder >= 0")
    if cfg.num_users < 1 or cfg.num_items < 1 or cfg.num_groups < 0:
        raise ValueError("num_users and num_items must be >= 1, num_groups >= 0")
    total_passes = timeslices.passes_per_day(cfg.split_interval_minutes, cfg.splits_per_pass)
    fs, root = fsspec.core.url_to_fs(cfg.out)
    rng = np.random.default_rng(cfg.seed)
    world = _World(cfg, rng)
    result = SynthResult()
    day = cfg.start
    for day_number in range(cfg.days):
        if day_number:
            world.new_day()
        for pass_index in range(1, total_passes + 1):
            folders = timeslices.pass_folders(
                cfg.out, day, pass_index, cfg.split_interval_minutes, cfg.splits_per_pass
            )
            names = timeslices.pass_folder_names(
                pass_index, cfg.split_interval_minutes, cfg.splits_per_pass
            )
            probs, labels = [], []
            for folder, name in zip(folders, names, strict=True):
                columns, hist, p = world.sample(cfg.rows_per_folder, int(name[:2]))
                y = (rng.random(p.shape[0]) < p).astype(np.int64)
                lines = _lines(columns, hist, y)
                path = f"{root.rstrip('/')}/{day}/{name}"
                fs.makedirs(path, exist_ok=True)
                for k, chunk in enumerate(
                    np.array_split(np.arange(len(lines)), cfg.files_per_folder)
                ):
                    text = "".join(lines[i] + "\n" for i in chunk.tolist())
                    fs.pipe_file(f"{path}/part-{k:05d}", text.encode())
                if write_donefiles:
                    fs.pipe_file(f"{path}/{cfg.donefile}", b"")
                result.folders.append(folder)
                probs.append(p)
                labels.append(y)
            p_all, y_all = np.concatenate(probs), np.concatenate(labels)
            result.passes.append(
                PassOracle(
                    day, pass_index, int(y_all.shape[0]), int(y_all.sum()), auc(p_all, y_all)
                )
            )
        day = timeslices.next_day(day)
    oracle = {
        "config": asdict(cfg),
        "slots": list(SLOTS),
        "sequenceSlot": SEQUENCE_SLOT,
        "passes": [asdict(p) for p in result.passes],
    }
    fs.pipe_file(f"{root.rstrip('/')}/oracle.json", json.dumps(oracle, indent=1).encode())
    fs.pipe_file(f"{root.rstrip('/')}/data.json", json.dumps(data_config(cfg), indent=1).encode())
    return result


class DonefileWriter:
    """Writes the donefiles of ``folders`` in order, one every ``delay_seconds``, in a thread."""

    def __init__(self, folders: Sequence[str], donefile: str, delay_seconds: float) -> None:
        self._folders = list(folders)
        self._donefile = donefile
        self._delay = delay_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="donefile-writer", daemon=True)
        self.written = 0

    def start(self) -> DonefileWriter:
        self._thread.start()
        return self

    def _run(self) -> None:
        for folder in self._folders:
            if self._stop.wait(self._delay):
                return
            fs, path = fsspec.core.url_to_fs(folder)
            fs.pipe_file(f"{path.rstrip('/')}/{self._donefile}", b"")
            self.written += 1

    def stop(self) -> None:
        self._stop.set()
        self.join()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


def generate_delayed(cfg: SynthConfig, delay_seconds: float) -> tuple[SynthResult, DonefileWriter]:
    """Write the data now and the donefiles later (a started ``DonefileWriter``)."""
    result = _generate(cfg, write_donefiles=False)
    return result, DonefileWriter(result.folders, cfg.donefile, delay_seconds).start()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m streamtrain_worker.data.synth", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--days", type=int, default=2)
    parser.add_argument("--start", default="20261101")
    parser.add_argument("--split-interval-minutes", type=int, default=60)
    parser.add_argument("--splits-per-pass", type=int, default=1)
    parser.add_argument("--rows-per-folder", type=int, default=1000)
    parser.add_argument("--files-per-folder", type=int, default=2)
    parser.add_argument("--donefile", default="_SUCCESS")
    parser.add_argument("--donefile-delay-seconds", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-users", type=int, default=SynthConfig.num_users)
    parser.add_argument("--num-items", type=int, default=SynthConfig.num_items)
    parser.add_argument(
        "--new-feature-fraction", type=float, default=SynthConfig.new_feature_fraction
    )
    parser.add_argument("--weight-persistence", type=float, default=SynthConfig.weight_persistence)
    parser.add_argument("--num-groups", type=int, default=SynthConfig.num_groups)
    parser.add_argument("--group-strength", type=float, default=SynthConfig.group_strength)
    parser.add_argument("--hour-strength", type=float, default=SynthConfig.hour_strength)
    parser.add_argument("--base-logit", type=float, default=SynthConfig.base_logit)
    args = parser.parse_args(argv)
    cfg = SynthConfig(
        out=args.out,
        days=args.days,
        start=args.start,
        split_interval_minutes=args.split_interval_minutes,
        splits_per_pass=args.splits_per_pass,
        rows_per_folder=args.rows_per_folder,
        files_per_folder=args.files_per_folder,
        seed=args.seed,
        donefile=args.donefile,
        num_users=args.num_users,
        num_items=args.num_items,
        new_feature_fraction=args.new_feature_fraction,
        weight_persistence=args.weight_persistence,
        num_groups=args.num_groups,
        group_strength=args.group_strength,
        hour_strength=args.hour_strength,
        base_logit=args.base_logit,
    )
    if args.donefile_delay_seconds > 0:
        result, writer = generate_delayed(cfg, args.donefile_delay_seconds)
    else:
        result, writer = generate(cfg), None
    for p in result.passes:
        print(
            json.dumps(
                {
                    "day": p.day,
                    "pass": p.pass_index,
                    "rows": p.rows,
                    "oracle_auc": round(p.oracle_auc, 4),
                }
            )
        )
    if writer is not None:
        writer.join()
    aucs = [p.oracle_auc for p in result.passes]
    print(
        json.dumps(
            {
                "out": cfg.out,
                "folders": len(result.folders),
                "passes": len(aucs),
                "mean_oracle_auc": float(np.mean(aucs)) if aucs else None,
            }
        )
    )


if __name__ == "__main__":
    main()
