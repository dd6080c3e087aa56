"""Case 8: the data of a trained pass changes before it is replayed.

A replay must train exactly the data the model saw. The job fails in pass 4 (a garbage
file: ``BadData``), after pass 3 was trained on top of the checkpoint of pass 2; then pass 3's
folder is purged (retention, a lifecycle rule) or one of its files rewritten. The rerun
reloads the checkpoint of pass 2 and would replay pass 3: its recorded file list
(``<checkpoint>/_passes/<day>/pass-3.json``) no longer verifies, so the job stops with
``DataChanged`` naming the folder — it never trains an empty or different pass 3, and
nothing is published or checkpointed.
"""

from __future__ import annotations

import shutil

import pytest

from streamtrain_operator.job.progress import Phase
from streamtrain_operator.run.export import read_donefile

from .harness import DETERMINISTIC, START, Job

PASS_3 = f"data/{START}/1200"
PASS_4 = f"data/{START}/1800"


@pytest.mark.faults
@pytest.mark.timeout(180)
@pytest.mark.parametrize("change", ["purged", "rewritten"])
def test_changed_data_before_a_replay_stops_the_job_naming_the_folder(
    job: Job, change: str
) -> None:
    job.write(days=1, **DETERMINISTIC)
    (job.root / PASS_4 / "part-00000").write_text("garbage\n" * 10)
    code, output = job.run()
    assert code == 1, output
    first = job.state()
    assert first is not None and first.phase == Phase.FAILED
    assert [r.pass_index for r in first.history] == [1, 2, 3]
    assert (job.root / "ckpt" / "_passes" / START / "pass-3.json").exists()
    checkpoints = sorted(p.name for p in (job.root / "ckpt" / START).iterdir())
    models = [d.key for d in read_donefile(str(job.root / "export"))]

    folder = job.root / PASS_3
    if change == "purged":
        shutil.rmtree(folder)
    else:
        part = folder / "part-00001"
        part.write_text(part.read_text().replace("1:click", "0:click"))  # same size
    code, output = job.run()
    assert code == 1, output
    state = job.state()
    assert state is not None and state.phase == Phase.FAILED
    failed = state.condition("Failed")
    assert failed is not None and failed.reason == "DataChanged", failed
    assert f"pass {START}/3: the data in {folder} changed" in failed.message
    assert f"{folder}/part-0000" in failed.message
    assert "put the files back as recorded in" in failed.message
    assert "error: DataChanged" in output
    # Nothing trained, published or checkpointed on different data.
    assert [r.pass_index for r in state.history] == [1, 2, 3]
    assert sorted(p.name for p in (job.root / "ckpt" / START).iterdir()) == checkpoints
    assert [d.key for d in read_donefile(str(job.root / "export"))] == models
