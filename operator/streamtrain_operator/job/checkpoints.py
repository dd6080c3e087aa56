"""The checkpoint folder name: ``<checkpoint root>/<day>/pass-<pass>-g<generation>``.

One folder per (day, pass) *and* scheduler generation: a driver that took over a job writes
its checkpoints under its own generation, so it never overwrites a save an earlier driver
may still be publishing, and a published checkpoint is never rewritten. The folder holds a
PS save, complete once its ``MANIFEST.json`` exists (``streamtrain_ps.saves.checkpoint``).

``CheckpointName.path`` builds the name (``plan.PassPlan.checkpoint_uri``) and
``CheckpointName.parse`` reads it back (the driver's pruning orders checkpoints by it); the
names compare as (day, pass, generation). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Every checkpoint folder below the checkpoint root matches this glob.
GLOB = "*/pass-*-g*"
_NAME = re.compile(r"(?:^|/)(?P<day>[0-9]{8})/pass-(?P<pass>[0-9]+)-g(?P<gen>[0-9]+)/?$")


@dataclass(frozen=True, order=True)
class CheckpointName:
    """Which step and generation a checkpoint folder holds."""

    day: str  # YYYYMMDD
    pass_index: int  # 0: the genesis checkpoint, before any training
    generation: int

    @property
    def path(self) -> str:
        """``<day>/pass-<pass>-g<generation>``, relative to the checkpoint root."""
        return f"{self.day}/pass-{self.pass_index}-g{self.generation}"

    @classmethod
    def parse(cls, path: str) -> CheckpointName:
        """The name of a checkpoint folder, from its path (absolute, relative or a URL)."""
        match = _NAME.search(path)
        if match is None:
            raise ValueError(
                f"{path}: not a checkpoint folder (expected <day>/pass-<pass>-g<generation>)"
            )
        return cls(match["day"], int(match["pass"]), int(match["gen"]))
