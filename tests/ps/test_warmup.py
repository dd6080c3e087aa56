"""The shard's kernel warm-up after start-up (``streamtrain_ps.tier.warmup``): it runs beside
real calls and changes nothing a shard computes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from streamtrain_ps.api import SaveMode
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier.warmup import start_warm_up

from .conftest import TWO_PHASE_TABLE as T
from .conftest import spread_keys as keys
from .conftest import two_phase_config as config
from .conftest import two_phase_push as push


def trained(tmp_path: Path, name: str, warm: bool) -> tuple[np.ndarray, list[str]]:
    """Pushes, a pull and a checkpoint of a fresh shard, with the warm-up running beside."""
    cfg = config()
    shard = Shard(cfg)
    thread = start_warm_up(cfg) if warm else None
    try:
        push(shard, keys(0, 500), show=3, click=1)
        push(shard, keys(250, 750), show=2, click=0, seed=1)
        pulled = shard.pull_sparse(T, keys(0, 750))
        result = shard.save(str(tmp_path / name), SaveMode.CHECKPOINT)
        checkpoint.publish(str(tmp_path / name), [result], config=cfg)
    finally:
        if thread is not None:
            thread.join(60)
            assert not thread.is_alive()
        shard.close()
    digests = sorted(
        f["sha256"] for f in checkpoint.read_manifest(str(tmp_path / name)).files.values()
    )
    return pulled, digests


def test_a_shard_warming_its_kernels_computes_what_a_cold_one_does(tmp_path: Path) -> None:
    cold_pull, cold_files = trained(tmp_path, "cold", warm=False)
    warm_pull, warm_files = trained(tmp_path, "warm", warm=True)
    assert np.array_equal(cold_pull, warm_pull)
    assert cold_files == warm_files


def test_a_capped_shard_is_not_warmed_again() -> None:
    # Its constructor already ran the same exercise before measuring its memory budget.
    assert start_warm_up(dataclasses.replace(config(), memoryLimit=1 << 30)) is None


def test_an_uncapped_shard_warms_the_kernels_it_calls_and_not_the_disk_tiers() -> None:
    # In a fresh process: numba's dispatchers list the signatures loaded so far.
    code = textwrap.dedent(
        """
        from streamtrain_ps.engine import kernels
        from streamtrain_ps.tier import tier_kernels
        from streamtrain_ps.tier.warmup import warm_table_kernels
        from tests.ps.conftest import two_phase_config

        warm_table_kernels(two_phase_config())
        loaded = lambda k: len(k.signatures) > 0
        print(loaded(kernels.merge_push), loaded(kernels.pull_kernel),
              loaded(kernels.shrink_kernel), loaded(tier_kernels.collect_cold),
              loaded(tier_kernels.sweep_cold))
        """
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert done.stdout.split() == ["True", "True", "True", "False", "False"]
