"""What a job keeps on storage: the newest checkpoints and the file lists a replay can need.

Every published checkpoint is a folder ``<checkpoint.path>/<day>/pass-<p>-g<gen>``
(``job/checkpoints``) with the PS's ``MANIFEST.json``; only the newest ``checkpoint.keep``
are kept, and the recorded file lists (``passfiles``) of days before the oldest kept
checkpoint go with them, since a replay never reaches back further. Best effort: a folder
that matches the glob but is not a checkpoint of ours is left alone.
"""

from __future__ import annotations

import fsspec

from streamtrain_operator.job import checkpoints
from streamtrain_operator.job.checkpoints import CheckpointName
from streamtrain_operator.run import passfiles
from streamtrain_ps.saves.checkpoint import MANIFEST


def prune_checkpoints(checkpoint_root: str, newest: str, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints under ``checkpoint_root`` (never ``newest``
    itself), and the recorded file lists of the days from the oldest kept one on."""
    fs, root = fsspec.core.url_to_fs(checkpoint_root)
    found: list[tuple[CheckpointName, str]] = []
    for manifest in fs.glob(f"{str(root).rstrip('/')}/{checkpoints.GLOB}/{MANIFEST}"):
        directory = str(manifest).rsplit("/", 1)[0]
        try:
            found.append((CheckpointName.parse(directory), directory))
        except ValueError:  # matches the glob but is no checkpoint of ours: leave it
            continue
    found.sort()
    newest_path = str(fsspec.core.url_to_fs(newest)[1]).rstrip("/")
    for _, directory in found[:-keep]:
        if directory.rstrip("/") != newest_path:
            fs.rm(directory, recursive=True)
    kept = found[-keep:]
    if kept:
        oldest_day = kept[0][0].day
        records = f"{str(root).rstrip('/')}/{passfiles.PASSES_DIR}"
        for day_dir in fs.glob(f"{records}/*"):
            if str(day_dir).rstrip("/").rsplit("/", 1)[-1] < oldest_day:
                fs.rm(day_dir, recursive=True)


def remove(uri: str) -> None:
    """Remove a folder and everything below it, if it exists (replay scratch)."""
    fs, path = fsspec.core.url_to_fs(uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)
