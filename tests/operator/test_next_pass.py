"""The read-ahead hint the driver sends with a RunPass: every worker's share of the next pass,
only once its data is complete, the recorded list for a pass that has one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes import make_job

from scripted_workers import FakeWorker, run, write_folder
from streamtrain_operator.job import render
from streamtrain_operator.job.plan import PassPlan, StepKey, StepKind
from streamtrain_operator.job.progress import Phase
from streamtrain_operator.run import next_pass, passfiles
from streamtrain_operator.run.state import MemoryStateStore
from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.data.sharding import assign_files
from streamtrain_worker.proto.share import PassShare

DAY = "20261101"


class HintedWorker(FakeWorker):
    """Records, per RunPass, the pass and the files it was told to read ahead."""

    def __init__(self, ps: LocalPS, index: int) -> None:
        super().__init__(ps, index)
        self.hints: list[tuple[int, tuple[str, ...], tuple[str, ...]]] = []

    async def run_pass(self, share: PassShare) -> Any:
        self.hints.append((share.pass_index, share.files, tuple(share.next_files)))
        return await super().run_pass(share)


def test_each_worker_is_told_its_share_of_the_next_pass(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, DAY, hhmm)
    ps = LocalPS(render.ps_config(job.spec))
    workers = [HintedWorker(ps, 0), HintedWorker(ps, 1)]
    assert run(job, workers, ps, MemoryStateStore()).phase == Phase.SUCCEEDED
    for w in workers:
        (p1, _, hint), (p2, files2, last) = w.hints
        assert (p1, p2) == (1, 2)
        assert hint == files2 and hint  # the hint is exactly what the next RunPass names
        assert last == ()  # the day's (and the job's) last pass: nothing comes after it


def test_no_hint_while_the_next_pass_has_no_donefile(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    write_folder(tmp_path, DAY, "0000")
    write_folder(tmp_path, DAY, "1200", done=False)  # still being written
    plan = PassPlan.from_spec(job.spec)
    first = StepKey(DAY, 1, StepKind.TRAIN)
    assert next_pass.next_shares(job.spec, plan, first, 2) == [[], []]
    (tmp_path / "data" / DAY / "1200" / "_SUCCESS").touch()
    second = StepKey(DAY, 2, StepKind.TRAIN)
    listed = passfiles.list_pass(next_pass.pass_folders(job.spec, second), "_SUCCESS")
    expected = assign_files([(f.path, f.size) for f in listed.files], 2)
    assert next_pass.next_shares(job.spec, plan, first, 2) == expected
    assert all(expected)


def test_a_pass_with_a_recorded_list_is_hinted_its_record(tmp_path: Path) -> None:
    """A replayed (or redone) pass trains its record: the hint is the record, not a new
    listing with a file added since."""
    job = make_job(tmp_path)
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, DAY, hhmm)
    plan = PassPlan.from_spec(job.spec)
    second = StepKey(DAY, 2, StepKind.TRAIN)
    recorded = passfiles.list_pass(next_pass.pass_folders(job.spec, second), "_SUCCESS")
    passfiles.save(passfiles.record_uri(plan.checkpoint_root, second), recorded)
    (tmp_path / "data" / DAY / "1200" / "part-00007").write_text("added after the record")
    shares = next_pass.next_shares(job.spec, plan, StepKey(DAY, 1, StepKind.TRAIN), 2)
    assert sorted(f for share in shares for f in share) == [f.path for f in recorded.files]


def test_the_next_train_step_crosses_the_day_end_and_stops_at_the_end_day() -> None:
    plan = PassPlan("20261101", "20261102", 2, 1, 1, True, True, "/exp", "/ckpt")
    assert plan.next_train(StepKey("20261101", 1, StepKind.TRAIN)) == StepKey(
        "20261101", 2, StepKind.TRAIN
    )
    assert plan.next_train(StepKey("20261101", 2, StepKind.TRAIN)) == StepKey(
        "20261102", 1, StepKind.TRAIN
    )
    assert plan.next_train(StepKey("20261102", 2, StepKind.TRAIN)) is None
