"""Compile every numba kernel into its on-disk cache once, at install (``make install``).

numba compiles a ``cache=True`` kernel at its first call and keeps the machine code next to
its source (``__pycache__/*.nbi``, ``*.nbc``); later processes load it in milliseconds. On a
fresh clone that cache is empty, so the first pass of the first run compiled everything the
PS and the workers call (its examples/s a small fraction of the next passes'), with nothing
on screen saying why. This runs those first calls on scratch inputs, with a line saying so:
the PS's table kernels with and without the disk tier and its dense optimizers
(``streamtrain_ps.tier.warmup``), and every data format's parser plus the key dedup
(``streamtrain_worker.control.warmup``). Nothing here reads data or touches a model.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

#: One data section per format (the parsers are per format).
FORMATS: tuple[dict[str, Any], ...] = (
    {"format": "slot", "slots": ["user", "item"], "labelSlot": "click"},
    {"format": "slot", "numSlots": 3},
    {"format": "criteo"},
    {"format": "avazu"},
    {"format": "libsvm"},
    {"format": "csv", "columns": {"click": "label", "a": "categorical", "b": "numeric"}},
)


def warm_ps() -> None:
    """Every table kernel (both tiers), and the dense Adam, SGD and summary rules."""
    from streamtrain_ps.config import DenseOptimizerConfig, PSConfig
    from streamtrain_ps.engine.dense import DenseVector
    from streamtrain_ps.tier.warmup import warm_kernels

    warm_kernels(PSConfig())
    values = np.zeros(8, np.float32)
    grads = values.view()
    grads.setflags(write=False)  # a request's gradients, decoded read-only (``wire``)
    for g in (values, grads):
        for rule in ("adam", "sgd"):
            DenseVector(values, DenseOptimizerConfig(type=rule)).push(g)
        DenseVector(values, DenseOptimizerConfig(), summary_decay=0.999).push(g)


def warm_worker() -> None:
    """Every format's parse kernel and the key dedup."""
    from streamtrain_worker.control.warmup import warm_kernels
    from streamtrain_worker.data.config import DataConfig

    for data in FORMATS:
        warm_kernels(DataConfig.from_dict(data))


def warm(out: TextIO) -> float:
    """Warm both; the seconds it took."""
    import streamtrain_ps

    cache = Path(streamtrain_ps.__file__).parent / "__pycache__"
    print(
        "== compiling the numba kernels into their cache, once (the PS's tables and dense "
        f"optimizers, the workers' parsers; {cache.parent.parent} and beside): "
        "later starts load them in milliseconds",
        file=out,
        flush=True,
    )
    started = time.perf_counter()
    warm_ps()
    warm_worker()
    seconds = time.perf_counter() - started
    print(f"   kernels cached in {seconds:.1f}s", file=out, flush=True)
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m streamtrain_tools.warm_cache", description=__doc__.split("\n")[0]
    ).parse_args(argv)
    warm(sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
