"""Every test run compiles against the kernels' current sources.

numba's on-disk cache checks only the timestamp of the file that holds a jitted function,
not of the functions it inlines from other modules, so after an edit to a callee (say
``streamtrain_ps.engine.optim``) a warm cache can keep running the old machine code. A run of the
tests therefore caches kernels under a directory named by a hash of every source file of
the packages (the PS and worker processes the tests start inherit it): the same sources
share a warm cache, changed ones compile afresh. A ``NUMBA_CACHE_DIR`` set by the caller
wins.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _kernel_cache_dir() -> Path:
    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("*/streamtrain_*/**/*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return Path(tempfile.gettempdir()) / "streamtrain-numba" / digest.hexdigest()[:16]


os.environ.setdefault("NUMBA_CACHE_DIR", str(_kernel_cache_dir()))
