"""Checkpoint retention: the newest ``checkpoint.keep`` checkpoints stay, with the recorded
file lists a replay from them can need."""

from __future__ import annotations

from pathlib import Path

from streamtrain_operator.run import retention


def _checkpoint(root: Path, day: str, name: str) -> Path:
    folder = root / day / name
    folder.mkdir(parents=True)
    (folder / "MANIFEST.json").write_text("{}")
    return folder


def test_older_checkpoints_and_their_file_lists_are_pruned(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    old = _checkpoint(root, "20261030", "pass-4-g1")
    newest = _checkpoint(root, "20261101", "pass-2-g1")
    for day in ("20261030", "20261031", "20261101"):
        (root / "_passes" / day).mkdir(parents=True)
        (root / "_passes" / day / "pass-1.json").write_text("{}")
    retention.prune_checkpoints(str(root), str(newest), keep=1)
    assert [p.name for p in sorted((root / "_passes").iterdir())] == ["20261101"]
    assert not old.exists()
    assert (newest / "MANIFEST.json").is_file()


def test_a_folder_that_is_no_checkpoint_of_ours_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    stranger = _checkpoint(root, "20261030", "pass-x-g1")
    newest = _checkpoint(root, "20261101", "pass-2-g1")
    retention.prune_checkpoints(str(root), str(newest), keep=1)
    assert stranger.is_dir() and newest.is_dir()


def test_remove_is_quiet_about_a_missing_folder(tmp_path: Path) -> None:
    retention.remove(str(tmp_path / "absent"))
    (tmp_path / "scratch" / "x").mkdir(parents=True)
    retention.remove(str(tmp_path / "scratch"))
    assert not (tmp_path / "scratch").exists()
