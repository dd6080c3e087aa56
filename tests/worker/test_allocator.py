"""The worker's malloc settings keep a batch's large buffers mapped for the next batch.

Checked in a child process (the settings are process-wide) by what they change: the page
faults of a thread that allocates, touches and frees the same four 1.4 MB buffers again
and again, as a worker's batch does with its dense gradient and its copies. No timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent(
    """
    import json, resource, sys, threading
    import numpy as np
    from streamtrain_worker.allocator import keep_scratch_mapped

    took = keep_scratch_mapped() if sys.argv[1] == "set" else None
    out = {}

    def batch():
        buffers = [np.ones(345_279, np.float32) for _ in range(4)]  # every page touched
        del buffers

    def batches():
        batch()  # the first batch faults its pages in either way
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(50):
            batch()
        out["faults"] = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    t = threading.Thread(target=batches)
    t.start()
    t.join()
    print(json.dumps({"took": took, "faults": out["faults"]}))
    """
)


def _faults(mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_batch_buffer_stays_mapped_for_the_next() -> None:
    default = _faults("default")
    kept = _faults("set")
    assert kept["took"] is True
    pages = 4 * 345_279 * 4 // 4096  # of one batch's buffers
    # glibc's defaults return the freed buffers: the batches fault their pages in again.
    assert isinstance(default["faults"], int) and default["faults"] >= 25 * pages
    # Kept mapped, the 50 batches reuse the first one's pages.
    assert isinstance(kept["faults"], int) and kept["faults"] < pages
