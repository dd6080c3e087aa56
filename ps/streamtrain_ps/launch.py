"""Run ``python -m streamtrain_ps`` as a child process on a free port (demo and bench).

The child binds port 0 and prints its start-up line first (``streamtrain_ps.startup``); we
read that line, so there is no port race and no polling. Leaving the context sends SIGTERM
and waits for the graceful stop. (The operator's local launcher does the same for whole
jobs.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import streamtrain_ps
from streamtrain_ps.config import PSConfig
from streamtrain_ps.startup import listening_address


@dataclass(frozen=True)
class ShardProcess:
    process: subprocess.Popen[str]
    address: str
    banner: str  # the ``listening on ...`` line


@contextmanager
def shard_process(
    config: PSConfig,
    workdir: Path,
    *,
    index: int = 0,
    count: int = 1,
    workers: int | None = None,
    log_level: str = "WARNING",
) -> Iterator[ShardProcess]:
    """Start shard ``index`` of ``count`` with ``config`` (written under ``workdir``)."""
    config_path = workdir / f"ps-{index}-of-{count}.json"
    config_path.write_text(config.to_json())
    env = dict(os.environ)
    # The child must import this very package even when it is not installed.
    source_root = str(Path(streamtrain_ps.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-m",
        "streamtrain_ps",
        "--port",
        "0",
        "--config",
        str(config_path),
        "--shard-index",
        str(index),
        "--num-shards",
        str(count),
        "--log-level",
        log_level,
    ]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline().strip()
        address = listening_address(banner)
        if address is None:
            raise RuntimeError(f"PS shard {index} did not start (exit {proc.wait()}): {banner!r}")
        yield ShardProcess(proc, address, banner)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
