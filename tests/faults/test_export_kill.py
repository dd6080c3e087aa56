"""Case 3b: SIGKILL ``streamtrain run`` while an export's parts are being written, and
while the end of a publication runs beside the next pass.

The pause hook ``parts:delta@2`` holds the run inside the publication of ``delta-2``: its
dense part and sparse parts are on disk (with the PS save's own ``MANIFEST.json``), its
``MODEL.json`` and donefile line are not. The sparse parts are the PS's snapshot of the
model after pass 2, written beside the next step — here the checkpoint of pass 2, which
waits for the publication — so delta-2 is already recorded. The run is killed there. What
must hold:

- while half written (held, and after the kill) the model is invisible: the donefile does
  not list it, the predictor's newest model is ``delta-1`` and asking for ``delta-2`` is
  "not published";
- the rerun's replay of delta-2 (recorded, not published) publishes it from scratch — the
  half-written directory is removed, not merged (a stray file planted in it is gone) —
  exactly once: one donefile
  line per model key, every file of the model directory listed in ``MODEL.json`` with its
  size and sha256, loadable by ``streamtrain_worker.publishing.predict.load_model``;
- the model state is unaffected: the final checkpoint is bit-identical to a run without the
  kill (the killed PS had already applied the delta save's side effect, ``delta_score``
  reset; the rerun reloads the checkpoint and replays, so it is applied once).

The end of a publication (``MODEL.json``, the donefile line) runs beside the next pass
(docs/scheduler.md §4). The hook ``manifest:delta@1`` holds there, after ``MODEL.json`` of
``delta-1``: the run records delta-1, trains pass 2 beside it, and is killed while the line
is still missing. The rerun's replay of delta-1 publishes it — once, first in the donefile,
the very model the clean run published — and every pass, the one trained beside the
publication included, is in the final checkpoint once (bit-identical to the clean run).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import Phase
from streamtrain_operator.run.export import read_donefile, verify_model
from streamtrain_operator.run.hooks import MANIFEST_POINT
from streamtrain_ps.saves.checkpoint import read_sparse
from streamtrain_worker.publishing.model_folder import DONEFILE, MODEL_MANIFEST
from streamtrain_worker.publishing.predict import ModelNotFoundError, load_model, model_chain

from .harness import (
    DETERMINISTIC,
    ONE_DAY_MODELS,
    START,
    Job,
    Reference,
    assert_same_model,
    checkpoint_of,
    read_checkpoint,
)

HALF = f"{START}/delta-2"


def assert_invisible(export: Path) -> None:
    """Readers, who go by the donefile only, cannot reach the half-written delta-2."""
    assert [d.key for d in read_donefile(str(export))] == [f"{START}/delta-1"]
    assert [d.key for d in model_chain(str(export))] == [f"{START}/delta-1"]
    with pytest.raises(ModelNotFoundError, match="no published model"):
        load_model(str(export), HALF)


def files_under(directory: Path) -> dict[str, tuple[int, str]]:
    """Every file below ``directory``: relative path -> (size, sha256)."""
    out = {}
    for f in sorted(directory.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            out[str(f.relative_to(directory))] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def _sorted_bytes(array: npt.NDArray[Any]) -> bytes:
    """Row order of a save depends on its shards' layout, not on the model: compare sorted."""
    if array.ndim == 1:
        return np.sort(array).tobytes()
    return array[np.lexsort(array.T[::-1])].tobytes()


@pytest.mark.faults
@pytest.mark.timeout(150)
def test_a_kill_between_an_exports_parts_redoes_it_once_and_never_shows_the_half(
    job: Job, reference: Reference
) -> None:
    job.write(days=1, **DETERMINISTIC)
    export = job.root / "export"
    first = job.start(pause="parts:delta@2")
    assert job.wait_paused(first) == f"parts delta {START}/2"
    # The sparse parts are written beside the next step: here the checkpoint of pass 2,
    # which waits for the publication before it runs (delta-2 is recorded, the checkpoint
    # only begun).
    held = job.wait_state(
        first,
        lambda p: p.current is not None and p.current.kind == StepKind.CHECKPOINT,
        "the checkpoint to wait for delta-2's publication",
    )
    assert held.completed == StepKey(START, 2, StepKind.DELTA)
    assert held.checkpoint is not None and held.checkpoint.key.pass_index == 0  # the genesis
    # Half written: the dense part and the sparse parts (with the PS save's own manifest),
    # no MODEL.json.
    half = export / HALF
    written = files_under(half)
    assert any(name.startswith("sparse/") and name != "sparse/MANIFEST.json" for name in written)
    assert any(name.startswith("dense/") for name in written)
    assert MODEL_MANIFEST not in written
    assert_invisible(export)
    first.kill_and_wait_children()
    # After the crash the half model stays on disk, still invisible; plant a stray part
    # to see whether the redo merges into the directory or starts it over.
    assert files_under(half) == written
    assert_invisible(export)
    (half / "sparse" / "part-stray").write_bytes(b"left by the killed attempt")

    code, output = job.run()
    assert code == 0, first.output + output
    after = job.state()
    assert after is not None and after.phase == Phase.SUCCEEDED
    assert [(r.day, r.pass_index) for r in after.history] == [(START, p) for p in (1, 2, 3, 4)]
    # Published exactly once: one donefile line per model key, in plan order.
    lines = read_donefile(str(export))
    assert [d.key for d in lines] == ONE_DAY_MODELS
    assert len((export / DONEFILE).read_text().splitlines()) == len(ONE_DAY_MODELS)
    # Complete: every file of the redone model is listed with its size and checksum (no
    # leftover of the killed attempt), and the checksums verify.
    manifest = verify_model(str(export), HALF)
    listed = {f.path: (f.size, f.sha256) for f in manifest.files}
    on_disk = files_under(half)
    assert on_disk.pop(MODEL_MANIFEST)
    assert on_disk == listed
    assert "sparse/part-stray" not in on_disk
    assert any(name.startswith("dense/") for name in listed)
    assert json.loads((half / MODEL_MANIFEST).read_text())["pass"] == 2
    for line in lines:
        assert verify_model(str(export), line.key).kind == line.kind
    loaded = load_model(str(export), HALF)
    assert loaded.chain == [f"{START}/delta-1", HALF]
    assert loaded.sparse.keys.shape[0] >= manifest.keys > 0
    # ... and it is the very model the clean run published: same keys, rows, tombstones.
    redone: tuple[npt.NDArray[Any], ...] = read_sparse(str(half / "sparse"), "embedding")
    expected: tuple[npt.NDArray[Any], ...] = read_sparse(
        str(reference.export / HALF / "sparse"), "embedding"
    )
    for got_array, clean_array in zip(redone, expected, strict=True):
        assert _sorted_bytes(got_array) == _sorted_bytes(clean_array)
    # The model saw every pass and every export side effect once.
    assert_same_model(read_checkpoint(checkpoint_of(job.root, START, 4)), reference.model)


@pytest.mark.faults
@pytest.mark.timeout(150)
def test_a_kill_in_a_publication_beside_the_next_pass_publishes_it_once_and_trains_once(
    job: Job, reference: Reference
) -> None:
    # The end of delta-1's publication (MODEL.json written, donefile line not) runs beside
    # pass 2; held there, the run trains pass 2 and then waits for it before delta-2.
    job.write(days=1, **DETERMINISTIC)
    export = job.root / "export"
    first = job.start(pause=f"{MANIFEST_POINT}:delta@1")
    assert job.wait_paused(first) == f"{MANIFEST_POINT} delta {START}/1"
    held = job.wait_state(
        first,
        lambda p: [(r.day, r.pass_index) for r in p.history] == [(START, 1), (START, 2)],
        "pass 2 to train beside delta-1's publication",
    )
    # delta-1 is recorded (pass 2 came after it), but not visible: no donefile line yet.
    assert held.completed == StepKey(START, 2, StepKind.TRAIN)
    assert (export / f"{START}/delta-1" / MODEL_MANIFEST).exists()
    assert read_donefile(str(export)) == []
    first.kill_and_wait_children()
    assert read_donefile(str(export)) == []

    code, output = job.run()
    assert code == 0, first.output + output
    after = job.state()
    assert after is not None and after.phase == Phase.SUCCEEDED
    # Pass 2 trained beside the publication is recorded once; the rerun's replay of delta-1
    # published it (once, first in the donefile).
    assert [(r.day, r.pass_index) for r in after.history] == [(START, p) for p in (1, 2, 3, 4)]
    lines = read_donefile(str(export))
    assert [d.key for d in lines] == ONE_DAY_MODELS
    for line in lines:
        assert verify_model(str(export), line.key).kind == line.kind
    assert json.loads((export / f"{START}/delta-1" / MODEL_MANIFEST).read_text())["pass"] == 1
    # The replay rebuilt delta-1's model state exactly: the model the clean run published.
    for key in (f"{START}/delta-1", HALF):
        got = read_sparse(str(export / key / "sparse"), "embedding")
        clean = read_sparse(str(reference.export / key / "sparse"), "embedding")
        for got_array, clean_array in zip(got, clean, strict=True):
            assert _sorted_bytes(got_array) == _sorted_bytes(clean_array)
    # Every pass, pass 2 included, was applied to the model once.
    assert_same_model(read_checkpoint(checkpoint_of(job.root, START, 4)), reference.model)
