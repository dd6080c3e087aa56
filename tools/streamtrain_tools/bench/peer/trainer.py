"""The peer's side of ``make bench-peer``: PaddlePaddle's parameter-server mode, one role.

Runs only under the peer's interpreter (its own virtualenv with ``paddlepaddle``), started by
``streamtrain_tools.bench.peer`` twice: once as the server (``TRAINING_ROLE=PSERVER``) and
once as the worker (``TRAINING_ROLE=TRAINER``), the role environment ``fleetrun`` would set,
on 127.0.0.1. Nothing in this repository's tests imports it.

What it runs is the flow of PaddleRec's online trainer, written here from its description:
``fleet`` in parameter-server mode (``is_collective=False``, asynchronous), one sparse table
behind ``sparse_embedding`` with the CTR accessor (show/click statistics, AdaGrad on the
1 + 8 weights, every key embedded from its first show), the CVM op, an MLP 512-256-128 under
Adam. Per pass: the pass's files loaded into memory through the pipe command
(``peer/pipe.py``, Criteo rows to the peer's text layout) with the next pass preloaded
while this one trains, an evaluation pass over the data before training on it (progressive
validation, the trainer's "infer" step), the training pass, and with ``--saves`` the
per-pass delta inference model, a checkpoint every ``--checkpoint-every`` passes, and at the
day's end shrink, base model and batch model.

The worker writes ``--out``: per pass the seconds of each step and the AUC histograms of the
evaluation and training passes (the driver turns them into AUCs with this repository's
``auc_from_histograms``, the same bucketing as Paddle's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from paddle.distributed import fleet
from paddle.distributed.fleet.base import role_maker

NUM_SLOTS = 39
#: Pulled per key by the CTR accessor: show, click, embed_w and 8 embedx weights.
PULL_DIM = 11
HIDDEN = (512, 256, 128)
TABLE = "embedding"


class Net:
    """The model's variables: feeds, prediction, loss and the AUC statistics."""

    def __init__(self) -> None:
        def feed(name: str) -> Any:
            return paddle.static.data(name=name, shape=[None, 1], dtype="int64", lod_level=1)

        self.show = feed("show")
        self.click = feed("click")
        self.slots = [feed(f"slot_{i}") for i in range(NUM_SLOTS)]
        show = paddle.cast(self.show, "float32")
        click = paddle.cast(self.click, "float32")
        entry = paddle.distributed.ShowClickEntry(show.name, click.name)
        cvm_input = paddle.concat([show, click], axis=1)
        pooled = []
        for slot in self.slots:
            emb = paddle.static.nn.sparse_embedding(
                input=slot,
                size=[1 << 40, PULL_DIM],
                padding_idx=0,
                entry=entry,
                param_attr=paddle.ParamAttr(name=TABLE),
            )
            bag = paddle.static.nn.sequence_pool(input=emb, pool_type="sum")
            pooled.append(paddle.static.nn.continuous_value_model(bag, cvm_input, use_cvm=True))
        x = paddle.concat(pooled, axis=1)
        for width in HIDDEN:
            x = paddle.static.nn.fc(x, width, activation="relu")
        logit = paddle.static.nn.fc(x, 1)
        self.predict = paddle.nn.functional.sigmoid(paddle.clip(logit, -15.0, 15.0))
        label = paddle.cast(self.click, "float32")
        self.loss = paddle.mean(paddle.nn.functional.log_loss(self.predict, label))
        two = paddle.concat([1 - self.predict, self.predict], axis=1)
        _, _, stats = paddle.static.auc(input=two, label=self.click, slide_steps=0)
        # batch_stat_pos, batch_stat_neg, stat_pos, stat_neg: the last two accumulate.
        self.stat_names = [stats[2].name, stats[3].name]

    @property
    def feeds(self) -> list[Any]:
        return [self.show, self.click, *self.slots]


def strategy(args: argparse.Namespace, net: Net) -> Any:
    """Asynchronous PS mode; the sparse table's accessor and optimizer rules."""
    s = fleet.DistributedStrategy()
    s.a_sync = True
    s.trainer_desc_configs = {"stat_var_names": net.stat_names}
    prefix = f"table_parameters.{TABLE}"
    rule = {"name": "SparseAdaGradSGDRule"}
    adagrad = {
        "learning_rate": args.lr,
        "initial_g2sum": 3.0,
        "initial_range": 0.0001,
        "weight_bounds": [-10.0, 10.0],
    }
    config: dict[str, Any] = {
        f"{prefix}.table_class": "MemorySparseTable",
        f"{prefix}.shard_num": 10,
        f"{prefix}.accessor.accessor_class": "CtrCommonAccessor",
        f"{prefix}.accessor.fea_dim": PULL_DIM,
        f"{prefix}.accessor.embedx_dim": PULL_DIM - 3,
        f"{prefix}.accessor.embedx_threshold": 0,
    }
    for part in ("embed_sgd_param", "embedx_sgd_param"):
        config[f"{prefix}.accessor.{part}.name"] = rule["name"]
        for key, value in adagrad.items():
            config[f"{prefix}.accessor.{part}.adagrad.{key}"] = value
    s.sparse_table_configs = {TABLE: config}
    return s


def dataset(net: Net, files: list[str], args: argparse.Namespace) -> Any:
    """An in-memory dataset over ``files`` read through the Criteo conversion pipe."""
    ds = paddle.distributed.InMemoryDataset()
    ds.init(
        batch_size=args.batch_size,
        thread_num=args.threads,
        use_var=net.feeds,
        pipe_command=f"{sys.executable} {Path(__file__).with_name('pipe.py')}",
    )
    ds.set_filelist(files)
    return ds


def take_stats(scope: Any, net: Net) -> dict[str, list[int]]:
    """The accumulated AUC histograms (positives, negatives per bucket), then zeroed."""
    out = {}
    for key, name in zip(("pos", "neg"), net.stat_names, strict=True):
        tensor = scope.find_var(name).get_tensor()
        values = np.array(tensor)
        out[key] = values.reshape(-1).astype(np.int64).tolist()
        tensor.set(np.zeros_like(values), paddle.CPUPlace())
    return out


def run_worker(args: argparse.Namespace, net: Net) -> dict[str, Any]:
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    scope = paddle.static.global_scope()
    program = paddle.static.default_main_program()
    folders = sorted(p for p in Path(args.data).glob("*/*") if p.is_dir())
    if not folders:
        raise SystemExit(f"{args.data}: no pass folders (<day>/<HHMM>/)")
    passes: list[dict[str, Any]] = []
    model_dir = Path(args.model_dir)
    next_ds = None
    first_pass_started = time.time()
    for index, folder in enumerate(folders, start=1):
        record: dict[str, Any] = {"pass": index}
        started = time.perf_counter()
        files = sorted(str(f) for f in folder.glob("part-*"))
        if next_ds is None:
            ds = dataset(net, files, args)
            ds.load_into_memory()
        else:
            ds = next_ds
            ds.wait_preload_done()
        record["load_seconds"] = time.perf_counter() - started
        next_ds = None
        if index < len(folders):
            next_files = sorted(str(f) for f in folders[index].glob("part-*"))
            next_ds = dataset(net, next_files, args)
            next_ds.preload_into_memory(args.threads)
        record["examples"] = int(ds.get_memory_data_size())
        take_stats(scope, net)
        t = time.perf_counter()
        exe.infer_from_dataset(program=program, dataset=ds, print_period=1 << 30)
        record["eval_seconds"] = time.perf_counter() - t
        record["eval_stats"] = take_stats(scope, net)
        t = time.perf_counter()
        exe.train_from_dataset(program=program, dataset=ds, print_period=1 << 30)
        record["train_seconds"] = time.perf_counter() - t
        record["train_stats"] = take_stats(scope, net)
        ds.release_memory()
        t = time.perf_counter()
        if args.saves:
            delta = model_dir / "delta" / f"{index:03d}"
            feed_names = [v.name for v in net.feeds]
            fleet.save_inference_model(exe, str(delta), feed_names, [net.predict], mode=1)
            if index % args.checkpoint_every == 0 and index != len(folders):
                fleet.save_persistables(exe, str(model_dir / "checkpoint" / f"{index:03d}"))
        record["save_seconds"] = time.perf_counter() - t
        passes.append(record)
    t = time.perf_counter()
    if args.saves:
        fleet.shrink()
        feed_names = [v.name for v in net.feeds]
        fleet.save_inference_model(exe, str(model_dir / "base"), feed_names, [net.predict], mode=2)
        fleet.save_persistables(exe, str(model_dir / "batch"), mode=3)
    day_end = time.perf_counter() - t
    fleet.stop_worker()
    return {
        "passes": passes,
        "day_end_seconds": day_end,
        "first_pass_started": first_pass_started,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trainer.py", description=__doc__)
    p.add_argument("--data", required=True, help="pass folders <day>/<HHMM>/part-*")
    p.add_argument("--out", required=True, help="the worker's JSON result")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--saves", action="store_true", help="per-pass delta saves and checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05, help="sparse AdaGrad learning rate")
    p.add_argument("--dense-lr", type=float, default=0.0005, help="dense Adam learning rate")
    args = p.parse_args(argv)
    paddle.enable_static()
    fleet.init(role_maker.PaddleCloudRoleMaker(is_collective=False))
    net = Net()
    optimizer = paddle.optimizer.Adam(learning_rate=args.dense_lr, lazy_mode=True)
    optimizer = fleet.distributed_optimizer(optimizer, strategy(args, net))
    optimizer.minimize(net.loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0
    result = run_worker(args, net)
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
