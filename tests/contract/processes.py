"""A component run as a child process whose output the test reads line by line.

Shared by the contract tests that start real PS/worker processes (``test_dashboards``,
``test_rendered_pods_run``), over the product's one launcher
(``streamtrain_ps.plumbing.launch``, ``watch=True``): a thread drains the merged
stdout/stderr into a queue, so a test waits for a line with a deadline instead of blocking on
a pipe, and everything read is kept for the failure message.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from streamtrain_ps.plumbing.launch import launch


class OutputProcess:
    """``args`` started in ``cwd``; ``next_line`` reads its output, ``stop`` ends it."""

    #: Seconds a SIGTERM'd process gets to stop gracefully before it is killed.
    grace: float = 20.0

    def __init__(self, args: list[str], cwd: Path, env: Mapping[str, str] | None = None) -> None:
        self.child = launch(
            Path(args[0]).name, args, None, watch=True, merge_stderr=True, env=env, cwd=cwd
        )
        self.proc = self.child.process
        #: Every line ``next_line`` returned.
        self.output: list[str] = self.child.output

    def next_line(self, deadline: float) -> str | None:
        """The next line of output (kept in ``output`` too), or ``None`` once ``deadline``
        (a ``time.monotonic()`` value) has passed without one."""
        return self.child.next_line(deadline)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds."""
        self.child.stop(self.grace)
