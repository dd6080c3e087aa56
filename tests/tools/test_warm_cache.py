"""``make install``'s last step: every numba kernel the PS and the workers call, compiled (or
loaded) once, with a line saying so."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

import streamtrain_ps
from streamtrain_tools import warm_cache


@pytest.mark.timeout(300)  # a cold cache compiles everything (make install's step ran it)
def test_warm_says_what_it_does_and_fills_the_cache() -> None:
    out = io.StringIO()
    warm_cache.warm(out)
    first, second = out.getvalue().splitlines()
    ps_root = Path(streamtrain_ps.__file__).parent
    assert first == (
        "== compiling the numba kernels into their cache, once (the PS's tables and dense "
        f"optimizers, the workers' parsers; {ps_root.parent} and beside): later starts load "
        "them in milliseconds"
    )
    assert re.fullmatch(r"   kernels cached in \d+\.\ds", second), second
    # numba writes beside the source, or under NUMBA_CACHE_DIR (which tests/conftest.py sets)
    # in a folder named after the source folder.
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    index_files = (
        Path(cache_dir).glob("engine_*/*.nbi")
        if cache_dir
        else (ps_root / "engine" / "__pycache__").glob("*.nbi")
    )
    cached = {p.name.split("-")[0] for p in index_files}
    # The table, dense and save kernels a pass and its exports call.
    assert {"kernels.merge_push", "kernels.pull_kernel", "dense._adam_kernel"} <= cached
    assert {"snapshot.after_save", "index.homes_of"} <= cached
