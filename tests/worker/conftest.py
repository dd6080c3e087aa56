"""Helpers the worker's tests share.

- The parser tests: where the sample data is, and how one block of text is parsed and read
  back per slot (``test_formats.py``, every format on real rows, and ``test_quoting.py``,
  RFC 4180 quoting, drive the parsers the same way).
- The training tests: a small worker config, the Criteo sample as six 'hourly' files
  (``chunks``) and one pass over them (``run``), for ``test_train.py`` and the tests built
  on it (dense refresh, ordinal slots, data norm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.formats import Format, ParsedBlock
from streamtrain_worker.data.reader import PassReader

if TYPE_CHECKING:  # the parser tests never import torch
    from streamtrain_worker.training.train import Trainer

AVAZU = SAMPLES_DIR / "avazu_sample_train.csv"
CRITEO = SAMPLES_DIR / "criteo_kaggle_sample_train.txt"
#: The key a missing numeric value hashes from (the kernels' sentinel).
MISSING = 1 << 63


def parse(fmt: Format, text: bytes, path: str = "mem") -> ParsedBlock:
    """Parse ``text`` as one block of a file at ``path`` (its header line, if the format
    has one, split off first as a reader would)."""
    header = None
    if fmt.has_header:
        header, _, text = text.partition(b"\n")
    parser = fmt.for_file(path, header)
    return parser.parse(np.frombuffer(text, dtype=np.uint8), 2 if fmt.has_header else 1)


def bags(parsed: ParsedBlock, example: int) -> list[list[int]]:
    """The keys of every slot of example ``example`` (one list per slot)."""
    b = parsed.batch
    s = b.num_slots
    return [
        b.keys[b.offsets[example * s + k] : b.offsets[example * s + k + 1]].tolist()
        for k in range(s)
    ]


# -- training -------------------------------------------------------------------------------


def worker_config(**model: object) -> WorkerConfig:
    return WorkerConfig.from_dict(
        {
            "data": {"format": "criteo"},
            "model": {"hiddenUnits": [32, 16], "batchSize": 200, "denseSyncSteps": 2, **model},
            "metrics": {"numBuckets": 4096},
            "ps": {"config": {"logicalShards": 8}},
        }
    )


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The 7,200 chronological rows as six 1,200-row 'hourly' files."""
    lines = CRITEO.read_text().splitlines(keepends=True)
    assert len(lines) == 7200, f"{CRITEO}: expected the 7,200-row sample"
    root = tmp_path_factory.mktemp("criteo")
    paths = []
    for i in range(6):
        path = root / f"part-{i:02d}"
        path.write_text("".join(lines[i * 1200 : (i + 1) * 1200]))
        paths.append(str(path))
    return paths


def run(trainer: Trainer, files: list[str], train: bool = True):  # type: ignore[no-untyped-def]
    cfg = trainer.config
    with PassReader(files, cfg.data, cfg.model.batchSize) as reader:
        return trainer.run_pass(reader, train=train)


def uniform_stream(seed: int, batches: int, rate: float, size: int = 100) -> list[Batch]:
    """``batches`` batches of ``size`` rows over four slots of 1,000 ids each, clicks at
    ``rate`` regardless of the ids (the base rate's and the calibration's tests)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        keys = (rng.integers(0, 1000, (size, 4)) + np.arange(4) * 1000).astype(np.uint64)
        labels = (rng.random(size) < rate).astype(np.float32)
        offsets = np.arange(0, 4 * size + 1, dtype=np.int64)
        out.append(Batch(labels, keys.reshape(-1), offsets, num_slots=4))
    return out


def hour_stream(seed: int, hour: int, rate: float, batches: int = 10) -> list[Batch]:
    """``uniform_stream`` with slot 0 holding one hour key in every row (a pass's context:
    the calibration's and the context rate's tests)."""
    out = []
    for batch in uniform_stream(seed, batches, rate):
        keys = batch.keys.reshape(-1, 4).copy()
        keys[:, 0] = 10_000 + hour
        out.append(Batch(batch.labels, keys.reshape(-1), batch.offsets, num_slots=4))
    return out
