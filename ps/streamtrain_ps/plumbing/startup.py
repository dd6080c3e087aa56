"""The start-up line a server prints once it accepts RPCs: ``listening on HOST:PORT``.

The PS shard (``python -m streamtrain_ps``) and the worker (``python -m streamtrain_worker``)
print it on stdout, flushed, right after binding, before any other stdout line. Launchers
(local mode, ``launch.shard_process``, the tests) read the bound address from it, so a
server started on port 0 needs no polling and has no port race. ``announce`` writes the line
and ``listening_address`` (or the ``LISTENING`` pattern, group 1) reads it: nothing else
knows its shape. It lives in the PS package, the bottom layer every launcher can import.
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

#: Matches the start-up line anywhere in a line of output; group 1 is ``HOST:PORT``.
LISTENING = re.compile(r"listening on (\S+:\d+)(?!\S)")


def announce(address: str, note: str = "", out: TextIO | None = None) -> None:
    """Print the start-up line for ``address`` (``HOST:PORT``), with an optional ``note``."""
    if LISTENING.fullmatch(f"listening on {address}") is None:
        raise ValueError(f"not a HOST:PORT address: {address!r}")
    line = f"listening on {address}" + (f" ({note})" if note else "")
    print(line, file=sys.stdout if out is None else out, flush=True)


def listening_address(line: str) -> str | None:
    """The ``HOST:PORT`` of a start-up line; ``None`` for any other line."""
    match = LISTENING.search(line)
    return None if match is None else match.group(1)
