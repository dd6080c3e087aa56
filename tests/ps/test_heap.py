"""The gRPC server's pool trims the heap after bulk requests, once they have returned."""

from __future__ import annotations

import threading
import time

from streamtrain_ps.plumbing.heap import ScratchReleasingExecutor, note_request_scratch


class Releases:
    """Counts the pool's trims."""

    def __init__(self) -> None:
        self.count = 0
        self.event = threading.Event()

    def __call__(self) -> None:
        self.count += 1
        self.event.set()


def pool(releases: Releases, **kwargs: float) -> ScratchReleasingExecutor:
    return ScratchReleasingExecutor(
        max_workers=4, release_after_keys=1000, release=releases, **kwargs
    )


def test_a_bulk_request_is_released_after_it_returns() -> None:
    releases = Releases()
    with pool(releases) as p:
        inside = threading.Event()
        go = threading.Event()

        def bulk_request() -> None:
            note_request_scratch(3000)
            inside.set()
            go.wait(5)

        running = p.submit(bulk_request)
        assert inside.wait(5)
        time.sleep(0.1)
        assert releases.count == 0  # its buffers are still referenced: nothing to trim yet
        go.set()
        running.result(5)
        assert releases.event.wait(5)
    assert releases.count == 1


def test_small_requests_add_up_and_trims_are_spaced() -> None:
    releases = Releases()
    with pool(releases, max_share=0.001) as p:
        for _ in range(9):
            p.submit(note_request_scratch, 100).result(5)
        time.sleep(0.1)
        assert releases.count == 0  # 900 keys of scratch: below the threshold
        p.submit(note_request_scratch, 100).result(5)
        assert releases.event.wait(5)
        releases.event.clear()
        # A second bulk request right away waits its turn (trims take <= max_share of time).
        p.submit(note_request_scratch, 5000).result(5)
        assert releases.event.wait(5)
    assert releases.count == 2


def test_a_busy_pool_still_trims_once_four_times_the_threshold_is_noted() -> None:
    releases = Releases()
    with pool(releases) as p:
        go = threading.Event()
        busy = p.submit(go.wait, 5)  # never idle while this runs
        p.submit(note_request_scratch, 2000).result(5)
        time.sleep(0.1)
        assert releases.count == 0
        p.submit(note_request_scratch, 2000).result(5)
        assert releases.event.wait(5)
        go.set()
        busy.result(5)


RESIDENT_BYTES_GIVEN_BACK = """
import os, sys
import numpy as np
from streamtrain_ps.plumbing.heap import reuse_large_buffers
if sys.argv[1] == "tuned":
    assert reuse_large_buffers()
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
buffer = np.ones(2_500_000, dtype=np.float32)  # 10 MB, the process's first large buffer
held = resident()
del buffer
print(held - resident())
"""


def resident_bytes_given_back(mode: str) -> int:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", RESIDENT_BYTES_GIVEN_BACK, mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def test_a_freed_large_buffer_stays_for_the_next_one() -> None:
    """A worker moves messages of megabytes every batch. With glibc's defaults a freed
    large buffer leaves the process at once, so the next one is mapped and faulted in
    afresh; with ``reuse_large_buffers`` it stays, for the next one to reuse."""
    assert resident_bytes_given_back("default") > 8_000_000
    assert resident_bytes_given_back("tuned") < 1_000_000
