"""Time one dense push (``DenseVector.push``) for an MLP's parameters.

``python -m streamtrain_tools.bench.ps.dense [--layers 512,256,128] [--pushes 200] [--optimizer
adam]`` prints the median and p90 milliseconds per push and ends with one JSON line. The
parameter count is that of a fully connected network over the given layer widths plus a
one-unit output (weights and biases).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from streamtrain_ps.config import DenseOptimizerConfig
from streamtrain_ps.engine.dense import DenseVector


def mlp_parameters(layers: Sequence[int]) -> int:
    widths = [*layers, 1]
    return sum(a * b + b for a, b in itertools.pairwise(widths))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", default="512,256,128", help="layer widths, input first")
    p.add_argument("--pushes", type=int, default=200)
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    args = p.parse_args(argv)
    n = mlp_parameters([int(w) for w in args.layers.split(",")])
    vec = DenseVector(np.zeros(n, np.float32), DenseOptimizerConfig(type=args.optimizer))
    grads = np.random.default_rng(0).normal(size=n).astype(np.float32)
    for _ in range(5):  # compile / warm caches
        vec.push(grads)
    times = []
    for _ in range(args.pushes):
        start = time.perf_counter()
        vec.push(grads)
        times.append(time.perf_counter() - start)
    ms = np.array(times) * 1e3
    result = {
        "parameters": n,
        "optimizer": args.optimizer,
        "push_ms_median": round(float(np.median(ms)), 3),
        "push_ms_p90": round(float(np.percentile(ms, 90)), 3),
    }
    print(f"dense {args.optimizer} push, {n:,} parameters: median {result['push_ms_median']} ms")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
