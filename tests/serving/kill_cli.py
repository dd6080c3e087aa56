"""``python -m streamtrain_worker.serving`` with a hook that SIGKILLs the process at one step:
``STREAMTRAIN_SERVING_KILL=<built|written|committed|midwrite>@<version>``. ``midwrite``
writes half of the version's rows, then dies (buckets of a version never committed)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from streamtrain_worker.serving import __main__ as cli
from streamtrain_worker.serving.tables import RedisTable


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    point, _, at = os.environ.get("STREAMTRAIN_SERVING_KILL", "").partition("@")
    target = int(at or 0)

    def hook(where: str, vid: int) -> None:
        if where == point and vid == target:
            _die()

    if point == "midwrite":
        original = RedisTable.write

        def write(self: RedisTable, version: Any, parent: Any, parts: Any) -> int:
            if version.id == target:
                half = [(k[: len(k) // 2], v[: len(k) // 2], t) for k, v, t in parts]
                original(self, version, parent, half)
                _die()
            return original(self, version, parent, parts)

        RedisTable.write = write  # type: ignore[method-assign]
    return cli.main(sys.argv[1:], hook=hook)


if __name__ == "__main__":
    sys.exit(main())
