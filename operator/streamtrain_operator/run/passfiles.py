"""The recorded file list of a dispatched pass: what "the same data" means for a replay.

A pass's folders are listed once, when the pass is first dispatched; the list — every data
file's path, size and version (the store's etag or the mtime), plus the names the listing
skipped — is written beside the checkpoints (``<checkpoint.path>/_passes/<day>/pass-<p>.json``,
so the custom resource's status stays small) before any worker gets a share. Every later
dispatch that must see the data the model already saw — the replay of a completed pass after
a reload, a share retried alone — uses that list and first verifies it against the store
(one listing per folder): a file that is gone or whose size or version changed raises
:class:`DataChangedError` naming the folder, and the job stops with ``DataChanged`` instead
of training on different data (a purged folder would otherwise list as an empty pass).

A pass started afresh (attempt 1, not a replay: nothing of it is in the model, since the PS
was just reloaded or never saw it) may re-list a folder whose content changed — that is how a
file fixed after a ``BadData`` failure gets trained — and records the new list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from streamtrain_operator.job.plan import StepKey, join_uri
from streamtrain_ps.plumbing import storage
from streamtrain_worker.data.layout import DataFile, scan_folder

#: Sub-directory of ``checkpoint.path`` holding the recorded file lists.
PASSES_DIR = "_passes"


class DataChangedError(RuntimeError):
    """A recorded file of a pass is gone or changed; the message names the folder."""


@dataclass(frozen=True)
class PassFiles:
    """The data of one pass as listed when it was first dispatched."""

    folders: tuple[str, ...]
    files: tuple[DataFile, ...]
    #: Names in the folders that are not data (``folder/name``): sub-folders, hidden,
    #: marker and temporary files.
    skipped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "folders": list(self.folders),
            "files": [{"path": f.path, "size": f.size, "version": f.version} for f in self.files],
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PassFiles:
        return cls(
            tuple(d["folders"]),
            tuple(
                DataFile(f["path"], int(f["size"]), str(f.get("version", ""))) for f in d["files"]
            ),
            tuple(d.get("skipped", ())),
        )


def record_uri(checkpoint_root: str, key: StepKey) -> str:
    return join_uri(checkpoint_root, f"{PASSES_DIR}/{key.day}/pass-{key.pass_index}.json")


def list_pass(folders: list[str], donefile: str) -> PassFiles:
    """List the pass's folders now."""
    files: list[DataFile] = []
    skipped: list[str] = []
    for folder in folders:
        listing = scan_folder(folder, donefile)
        files += listing.files
        skipped += [f"{folder.rstrip('/')}/{name}" for name in listing.skipped]
    return PassFiles(tuple(folders), tuple(files), tuple(skipped))


def differences(recorded: PassFiles, now: PassFiles) -> list[tuple[str, str]]:
    """What changed in the recorded files, as (path, what); empty: the same data. Files
    added since are no difference: the recorded list is what is trained."""
    current = {f.path: f for f in now.files}
    found = []
    for f in recorded.files:
        c = current.get(f.path)
        if c is None:
            found.append((f.path, "is gone"))
        elif c.size != f.size:
            found.append((f.path, f"changed size ({f.size} -> {c.size} bytes)"))
        elif f.version and c.version != f.version:
            found.append((f.path, f"changed (version {f.version} -> {c.version})"))
    return found


def verify(recorded: PassFiles, donefile: str, where: str, uri: str) -> None:
    """Raise :class:`DataChangedError` when a recorded file is gone or changed."""
    found = differences(recorded, list_pass(list(recorded.folders), donefile))
    if not found:
        return
    folders = sorted({path.rsplit("/", 1)[0] for path, _ in found})
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    listed = "; ".join(f"{path} {what}" for path, what in found[:3])
    raise DataChangedError(
        f"{where}: the data in {', '.join(folders)} changed since the pass was trained: "
        f"{listed}{more}. The model cannot be rebuilt from it: put the files "
        f"back as recorded in {uri} and run the job again (if they are gone for good, the "
        "passes after the last checkpoint cannot be replayed: start a new job from the last "
        "exported model, and keep retention longer than checkpoint.everyPasses passes)"
    )


def load(uri: str) -> PassFiles | None:
    """The recorded list, or ``None`` when the pass was never dispatched (or recorded by
    an operator from before these records)."""
    fs, path = storage.filesystem(uri)
    try:
        with fs.open(path, "rb") as f:
            return PassFiles.from_dict(json.loads(f.read()))
    except FileNotFoundError:
        return None


def save(uri: str, files: PassFiles) -> None:
    """Write the record durably (``storage.write_durable``: readers see it whole or not)."""
    fs, path = storage.filesystem(uri)
    storage.write_durable(fs, path, json.dumps(files.to_dict(), indent=1).encode())
