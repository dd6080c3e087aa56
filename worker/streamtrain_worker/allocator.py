"""Keep a worker's per-batch buffers mapped from one batch to the next (glibc malloc).

Every batch allocates and frees the same few large buffers: the dense gradient (1.38 MB
for the bench's 345k-parameter network) and its wire copies, the pulled rows, torch's
activations and gradients. glibc's defaults hand each of them back to the kernel when it
is freed — a buffer above the mmap threshold is its own mapping, unmapped at ``free``; the
threshold adapts upwards, but then the trim threshold (twice that) returns the freed top
of a thread's heap — so the next batch's buffer is a fresh mapping whose pages fault in
and are zeroed again, and every unmap of a multi-threaded process interrupts the other
cores to flush their TLBs. Measured on the push and pull path alone (the PS over gRPC, a
Criteo-shaped batch): ~1,660 page faults a batch in the client and 7.3 ms of its CPU;
with the two thresholds fixed high, ~4 faults and 2.8 ms (docs/benchmarks.md, issue 11).

A worker holds no table, so what this keeps is its per-batch scratch, which the next
batch needs again anyway: each thread's heap keeps at most ``TRIM_THRESHOLD`` of free top
before it is trimmed. The PS shard does not use this: its memory is budgeted
(``streamtrain_ps.heap`` trims after bulk requests instead).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

#: glibc's ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Allocations below this come from the heaps, not from mappings of their own. 32 MiB is
#: glibc's ceiling for it (half a thread heap's 64 MiB) and above the 300-slot shape's
#: 6.2 MB dense gradient.
MMAP_THRESHOLD = 32 << 20
#: Free memory a heap keeps at its top before returning it to the kernel.
TRIM_THRESHOLD = 128 << 20


def _mallopt() -> Callable[[int, int], int] | None:
    try:
        fn: Callable[[int, int], int] = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (or no C library symbols): nothing to set
        return None
    return fn


def keep_scratch_mapped(
    mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD
) -> bool:
    """Fix malloc's mmap and trim thresholds for this process (setting either turns off
    glibc's own adaptation, so both are set). True if the C library took both."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    took_mmap = mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1
    took_trim = mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1
    return took_mmap and took_trim
