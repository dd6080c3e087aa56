"""Which files each worker may read ahead: its share of the pass expected next.

A RunPass carries, beside the worker's files of the pass, its files of the next train step
(``next_files``), so that the worker reads and parses them while the current pass trains
(``streamtrain_worker.training.read_ahead``). This is a hint, never a commitment: what the next
RunPass names is decided when that pass is dispatched (``driver._assignment``, which lists
and records, or verifies a recorded list), and the worker uses what it read ahead only if
the two agree file for file and nothing changed since it was read. So the hint may be
wrong at no cost but the read: a folder that changes before the next dispatch, a restore
in between, a pass that never comes.

The hint is the next pass's recorded list when it has one (a replay, or a pass begun by an
earlier run: its dispatch trains the record if unchanged), else a listing of its folders
once every one has its donefile — and nothing when the data is not complete yet (a stream
that is caught up: the next RunPass reads as before). The assignment is the same
deterministic function of the listing as the dispatch's (``assign_files``).
"""

from __future__ import annotations

import logging

from streamtrain_operator.job.plan import PassPlan, StepKey
from streamtrain_operator.job.spec import JobSpec
from streamtrain_operator.run import passfiles
from streamtrain_worker.data import layout, timeslices
from streamtrain_worker.data.sharding import assign_files

log = logging.getLogger(__name__)


def pass_folders(spec: JobSpec, key: StepKey) -> list[str]:
    """The data folders of the pass ``key`` (``data.path`` and the time-slice layout)."""
    d = spec.data
    return timeslices.pass_folders(
        d.path,
        key.day,
        key.pass_index,
        d.splitIntervalMinutes,
        d.splitsPerPass,
        hourly_names=d.layout == "HH",
    )


def next_shares(spec: JobSpec, plan: PassPlan, key: StepKey, workers: int) -> list[list[str]]:
    """Every worker's files of the train step after ``key``; empty lists when there is no
    such step or its data is not complete. Never raises: a hint that cannot be made is no
    hint (a listing error is the dispatch's to report)."""
    none: list[list[str]] = [[] for _ in range(workers)]
    following = plan.next_train(key)
    if following is None:
        return none
    try:
        files = passfiles.load(passfiles.record_uri(plan.checkpoint_root, following))
        if files is None:
            folders = pass_folders(spec, following)
            donefile = spec.data.donefile
            if not all(layout.folder_ready(f, donefile) for f in folders):
                return none
            files = passfiles.list_pass(folders, donefile)
        return assign_files([(f.path, f.size) for f in files.files], workers)
    except Exception as exc:  # a hint is optional: the dispatch reports the errors
        log.info("no read-ahead hint for pass %s/%s: %s", following.day, following.pass_index, exc)
        return none
