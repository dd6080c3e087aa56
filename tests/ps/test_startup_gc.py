"""A server process's imports run with the garbage collector paused, then frozen.

Each case runs in a fresh interpreter: freezing is for a whole process, and pytest's own
objects must stay collectable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def run_python(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_imports_run_uncollected_and_stay_out_of_later_collections() -> None:
    seen = run_python(
        """
        import gc, json
        from streamtrain_ps.plumbing.startup_gc import collector_paused
        frozen_before = gc.get_freeze_count()
        with collector_paused():
            inside = gc.isenabled()
            import numpy  # what a start-up imports: objects that live as long as the process
            start_up = [[i] for i in range(10_000)]
        print(json.dumps({
            "inside": inside,
            "after": gc.isenabled(),
            "frozen": gc.get_freeze_count() - frozen_before,
            # the collector's generations no longer hold it: no collection walks it again
            "visited": any(o is start_up for o in gc.get_objects()),
        }))
        """
    )
    assert seen["inside"] is False
    assert seen["after"] is True
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 10_000
    assert seen["visited"] is False


def test_a_failed_start_up_leaves_the_collector_as_it_found_it() -> None:
    seen = run_python(
        """
        import gc, json
        from streamtrain_ps.plumbing.startup_gc import collector_paused
        states = []
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            try:
                with collector_paused():
                    raise ImportError("a missing module")
            except ImportError:
                states.append(gc.isenabled())
        print(json.dumps({"states": states}))
        """
    )
    assert seen["states"] == [True, False]
