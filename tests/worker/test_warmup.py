"""The worker loads its parse and dedup kernels at start-up, not in the first batch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamtrain_worker.control.warmup import start_warm_up, warm_kernels
from streamtrain_worker.data.config import DataConfig

# In a fresh interpreter (in this one other tests may have compiled the kernels already):
# nothing is loaded before the warm-up, both kernels are afterwards.
PROBE = """
from streamtrain_ps.client import dedup
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.formats import delimited
from streamtrain_worker.control.warmup import start_warm_up
before = (len(delimited._kernel.signatures), len(dedup._first_and_inverse.signatures))
start_warm_up(DataConfig.from_dict({"format": "criteo"})).join()
after = (len(delimited._kernel.signatures), len(dedup._first_and_inverse.signatures))
print(before, after)
"""


def test_the_warm_up_loads_the_parse_and_dedup_kernels() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert out.stdout.split("\n")[0] == "(0, 0) (1, 1)", out.stderr


@pytest.mark.parametrize(
    "data",
    [
        {"format": "criteo"},
        {"format": "avazu"},
        {"format": "csv", "header": True, "columns": {"click": "label", "a": "categorical"}},
        {"format": "slot", "numSlots": 3},
    ],
)
def test_every_format_warms_up_or_leaves_its_kernel_to_the_first_file(data: dict) -> None:
    config = DataConfig.from_dict(data)
    warm_kernels(config)  # raises if a format cannot parse a blank line
    start_warm_up(config).join(timeout=60)
