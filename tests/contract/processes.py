"""A component run as a child process whose output the test reads line by line.

Shared by the contract tests that start real PS/worker processes (``test_dashboards``,
``test_rendered_pods_run``): a thread drains the merged stdout/stderr into a queue, so a test
waits for a line with a deadline instead of blocking on a pipe, and everything read is kept
for the failure message.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path


class OutputProcess:
    """``args`` started in ``cwd``; ``next_line`` reads its output, ``stop`` ends it."""

    #: Seconds a SIGTERM'd process gets to stop gracefully before it is killed.
    grace: float = 20.0

    def __init__(self, args: list[str], cwd: Path, env: Mapping[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def next_line(self, deadline: float) -> str | None:
        """The next line of output (kept in ``output`` too), or ``None`` once ``deadline``
        (a ``time.monotonic()`` value) has passed without one."""
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        self.output.append(line)
        return line

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
