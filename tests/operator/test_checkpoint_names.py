"""The checkpoint folder name: built by the plan, parsed back by the driver's pruning."""

from __future__ import annotations

import pytest

from streamtrain_operator.job.checkpoints import CheckpointName
from streamtrain_operator.job.plan import PassPlan, StepKey, StepKind


def test_name_round_trips_through_every_kind_of_path() -> None:
    name = CheckpointName("20261101", 3, 12)
    assert name.path == "20261101/pass-3-g12"
    for path in (name.path, f"/data/ckpt/{name.path}", f"s3://bucket/ckpt/{name.path}/"):
        assert CheckpointName.parse(path) == name


def test_the_plan_builds_its_checkpoint_uris_with_it() -> None:
    plan = PassPlan(
        start_day="20261101",
        end_day=None,
        passes_per_day=4,
        delta_every=1,
        checkpoint_every=2,
        base=True,
        batch=False,
        export_root="/export",
        checkpoint_root="/ckpt/",
    )
    uri = plan.checkpoint_uri(StepKey("20261101", 0, StepKind.CHECKPOINT), 4)
    assert uri == "/ckpt/20261101/pass-0-g4"
    assert CheckpointName.parse(uri) == CheckpointName("20261101", 0, 4)


def test_names_order_by_day_then_pass_then_generation() -> None:
    names = [
        CheckpointName("20261102", 1, 1),
        CheckpointName("20261101", 10, 1),
        CheckpointName("20261101", 2, 3),
        CheckpointName("20261101", 2, 1),
    ]
    assert [n.path for n in sorted(names)] == [
        "20261101/pass-2-g1",
        "20261101/pass-2-g3",
        "20261101/pass-10-g1",
        "20261102/pass-1-g1",
    ]


@pytest.mark.parametrize(
    "path",
    [
        "/ckpt/20261101/pass-3",
        "/ckpt/20261101/pass-3-gx",
        "/ckpt/2026-11-01/pass-3-g1",
        "/ckpt/_scratch/g1-20261101-3-delta",
        "",
    ],
)
def test_a_path_that_is_no_checkpoint_folder_is_named_in_the_error(path: str) -> None:
    with pytest.raises(ValueError, match=f"{path}: not a checkpoint folder"):
        CheckpointName.parse(path)
