"""A file of the next pass rewritten after the worker read it ahead.

The worker reads pass 2's files while pass 1 trains (the driver names them with pass 1's
RunPass once pass 2's donefile is there). The run is held before pass 2 is dispatched and
one of its files loses half its rows: the driver lists and records the folder anew, and
the worker, finding the file's size and mtime changed since it read it, reads it again —
pass 2 trains exactly the recorded, new content, not what was parsed ahead; the passes
after it are read ahead as usual.
"""

from __future__ import annotations

import json

import pytest

from streamtrain_operator.job.progress import Phase

from .harness import START, Job

PASS_2 = f"data/{START}/0600"


@pytest.mark.faults
@pytest.mark.timeout(180)
def test_a_file_rewritten_after_its_read_ahead_is_trained_as_rewritten(job: Job) -> None:
    job.write(days=1)
    run = job.start(pause="before:train@2")
    assert job.wait_paused(run) == f"before train {START}/2"
    part = job.root / PASS_2 / "part-00001"
    lines = part.read_text().splitlines(keepends=True)
    kept = len(lines) // 2
    part.write_text("".join(lines[:kept]))
    rows = sum(len(p.read_text().splitlines()) for p in (job.root / PASS_2).glob("part-*"))
    job.release()
    assert run.wait(120) == 0, run.output

    state = job.state()
    assert state is not None and state.phase == Phase.SUCCEEDED
    second = state.history[1].metrics
    assert second["examples"] == rows  # the file as rewritten, all of it, once
    assert second["filesReadAhead"] == 0  # what was parsed ahead was not used
    log = (job.root / ".streamtrain" / "faults" / "logs" / "worker-0.log").read_text()
    assert f"{part} changed since it was read ahead" in log  # it was, and was dropped
    assert [r.metrics["filesReadAhead"] for r in state.history[2:]] == [2, 2]
    record = json.loads((job.root / "ckpt" / "_passes" / START / "pass-2.json").read_text())
    sizes = {f["path"].rsplit("/", 1)[1]: f["size"] for f in record["files"]}
    assert sizes["part-00001"] == part.stat().st_size  # recorded: what was trained
