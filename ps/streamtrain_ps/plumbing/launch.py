"""The one child-process launcher: start a command with its output in a log file, learn the
address it announces, stop it gracefully.

Used by local mode (``streamtrain run`` starts the job's PS shards and workers), by the PS
benchmarks (``streamtrain_ps.service.process.shard_process``) and by the tests' kubelet. It
lives in the shared plumbing because all of them import it.

- **Address**: a PS shard or worker started with ``--port 0`` prints
  ``listening on HOST:PORT`` once it serves; :func:`launch` with ``announce=True`` reads its
  stdout until that line (:func:`listening_address` is the one parser), then a thread drains
  the rest into the log, so a pipe nobody reads never fills. No port race, no polling.
- **Dying with the parent** (``python_argv(..., die_with_parent=True)``): on Linux the child's
  own fresh interpreter first sets ``PR_SET_PDEATHSIG`` (SIGKILL) and then ``exec``s the real
  command — the setting survives ``execve`` — so even a SIGKILLed parent takes its children
  with it. No ``preexec_fn``, which is unsafe after ``fork`` in a process with gRPC threads.
  The signal is tied to the *thread* that started the child: start such children from a
  thread that lives as long as they should.
- **Watching**: ``watch=True`` also queues every output line for :meth:`Launched.next_line`,
  read with a deadline (the tests that wait for a line a server logs).
- **Stopping**: SIGTERM (the servers drain in-flight RPCs), SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from streamtrain_ps.plumbing.startup import listening_address

PR_SET_PDEATHSIG = 1

#: Run by ``python -c`` in the child: die with the parent, then become the real command.
_PRELUDE = (
    "import ctypes, ctypes.util, os, sys\n"
    "libc = ctypes.util.find_library('c')\n"
    f"if libc: ctypes.CDLL(libc).prctl({PR_SET_PDEATHSIG}, {int(signal.SIGKILL)})\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)  # the parent died before prctl\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


def free_port(*, below_ephemeral: bool = False) -> int:
    """A port on 127.0.0.1 nothing listens on now, for a child that binds it a moment later.

    ``below_ephemeral``: for a port bound seconds later and again after a restart, so it
    must not be handed out meanwhile: ports of the kernel's ephemeral range are (to
    ``bind(0)`` and to every outgoing connection on the machine), ports below it only to
    an explicit bind. Prefer ``--port 0`` and the start-up line where the child allows it.
    """
    if not below_ephemeral:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise LaunchError(f"no free port below {low} after 200 tries")


class LaunchError(RuntimeError):
    """A child process did not start (its log file is named in the message)."""


def python_argv(
    args: Sequence[str], *, python: str = sys.executable, die_with_parent: bool = False
) -> list[str]:
    """``python args...``; with ``die_with_parent`` (Linux), behind the death-signal prelude."""
    if die_with_parent and sys.platform == "linux":
        return [python, "-c", _PRELUDE, str(os.getpid()), *args]
    return [python, *args]


@dataclass
class Launched:
    """One started child process: its log and, once announced, its address."""

    name: str
    process: subprocess.Popen[str]
    #: Where its output goes (``None``: nowhere but the watched lines).
    log_path: Path | None
    address: str = ""
    #: The lines :meth:`next_line` returned so far (``watch=True``).
    output: list[str] = field(default_factory=list)
    _lines: queue.Queue[str] | None = field(default=None, repr=False)
    _drain: threading.Thread | None = field(default=None, repr=False)
    _announced: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self) -> bool:
        return self.process.poll() is not None

    def wait_listening(self, timeout: float) -> str:
        """Block until the child announced its address (``announce=True``); a child that
        exits or stays silent for ``timeout`` seconds is a :class:`LaunchError` quoting the
        end of its log."""
        if not self._announced.wait(timeout) or not self.address:
            raise LaunchError(
                f"{self.name} did not start (exit code {self.process.poll()}); "
                f"see {self.log_path}:\n{self.tail()}"
            )
        return self.address

    def tail(self, lines: int = 20) -> str:
        if self.log_path is None:
            return "".join(self.output[-lines:])
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def next_line(self, deadline: float) -> str | None:
        """The next output line (``launch(watch=True)``), newline included and kept in
        ``output``, or ``None`` once ``deadline`` (a ``time.monotonic()`` value) passed."""
        if self._lines is None:
            raise ValueError(f"{self.name} was launched without watch=True")
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        self.output.append(line)
        return line

    def send_input(self, text: str) -> None:
        """Write ``text`` to the child's stdin (``launch(stdin=True)``) and close it."""
        stdin = self.process.stdin
        if stdin is None:
            raise ValueError(f"{self.name} was launched without stdin")
        try:
            stdin.write(text)
        finally:
            stdin.close()

    def kill(self) -> None:
        """SIGKILL (a crash); returns at once."""
        if self.process.poll() is None:
            self.process.kill()

    def stop(self, grace: float) -> None:
        """SIGTERM, SIGKILL after ``grace`` seconds; returns once it exited."""
        stop_all([self], grace)

    def _read(self, stdout: IO[str]) -> None:
        with self.log_path.open("a") if self.log_path else contextlib.nullcontext() as log:
            for line in stdout:
                if not self.address and (address := listening_address(line)):
                    self.address = address
                    self._announced.set()
                if log is not None:
                    log.write(line)
                    log.flush()
                if self._lines is not None:
                    self._lines.put(line)
        self._announced.set()  # exited (or closed its stdout) without announcing


def launch(
    name: str,
    argv: Sequence[str],
    log_path: Path | None,
    *,
    announce: bool = False,
    watch: bool = False,
    merge_stderr: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    new_session: bool = False,
    stdin: bool = False,
) -> Launched:
    """Start ``argv`` with stdin closed and stdout + stderr appended to ``log_path``.

    ``stdin``: a pipe instead, written once by :meth:`Launched.send_input` (a worker started
    before its PS endpoints are known reads its config from it).

    ``announce``: the child prints ``listening on HOST:PORT``; its stdout goes through a
    drain thread that records the address (:meth:`Launched.wait_listening`).
    ``watch``: the drain thread also queues every stdout line (:meth:`Launched.next_line`);
    ``merge_stderr``: stderr goes where stdout goes (the log, or the drain thread).
    ``log_path`` ``None``: the output is kept nowhere but the watched lines.
    ``new_session``: a signal to the parent's process group does not reach the child.
    """
    drained = announce or watch
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") if log_path else contextlib.nullcontext() as log:
        sink = log if log is not None else subprocess.DEVNULL
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE if drained else sink,
            stderr=subprocess.STDOUT if merge_stderr else sink,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            text=True,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=new_session,
        )
    child = Launched(name, process, log_path, _lines=queue.Queue() if watch else None)
    if drained:
        assert process.stdout is not None
        child._drain = threading.Thread(
            target=child._read, args=(process.stdout,), name=f"drain-{name}", daemon=True
        )
        child._drain.start()
    return child


def stop_all(children: Iterable[Launched], grace: float) -> None:
    """SIGTERM every child, wait up to ``grace`` seconds in all, SIGKILL what is left."""
    children = list(children)
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
        if child._drain is not None:
            child._drain.join(timeout=5)
