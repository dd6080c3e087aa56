"""``python -m faults.run_cli run job.yaml``: the ``streamtrain`` command line with the
fault tests' pause hook (``pause.PauseHook``, armed by ``STREAMTRAIN_PAUSE``) injected."""

from __future__ import annotations

import sys

from streamtrain_operator.cli import main

from .pause import PauseHook

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], step_hook=PauseHook.from_env()))
