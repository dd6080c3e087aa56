"""``docs/architecture.md`` maps every module, and no folder of the product outgrows a room.

A newcomer finds a module's room through the map; a module missing from it, or a folder of
more than ~15 modules, is how the parameter server's house got lost before (issue 27).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "ps": "streamtrain_ps",
    "worker": "streamtrain_worker",
    "operator": "streamtrain_operator",
    "tools": "streamtrain_tools",
}
#: A room holds a handful of modules; the issue's bound is "~15".
MAX_MODULES_PER_FOLDER = 15


def _modules(package: Path) -> list[Path]:
    """Every hand-written module of a package (generated gRPC code and ``__init__`` left out)."""
    return [
        p
        for p in package.rglob("*.py")
        if p.name != "__init__.py" and not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    ]


@pytest.mark.parametrize("wing", sorted(PACKAGES))
def test_every_module_is_on_the_map(wing: str) -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    package = ROOT / wing / PACKAGES[wing]
    missing = sorted(
        str(p.relative_to(package))
        for p in _modules(package)
        # named in code type on one line: `stem`, `room/stem`, `a, stem`, ...
        if not re.search(rf"`[^`\n]*(?<![\w.]){re.escape(p.stem)}(?!\w)[^`\n]*`", text)
    )
    assert not missing, f"docs/architecture.md does not name these {wing} modules: {missing}"


@pytest.mark.parametrize("wing", sorted(PACKAGES))
def test_no_folder_holds_more_than_a_room(wing: str) -> None:
    package = ROOT / wing / PACKAGES[wing]
    crowded = {
        str(folder.relative_to(ROOT)): n
        for folder in [package, *(d for d in package.rglob("*") if d.is_dir())]
        if (n := sum(1 for p in _modules(folder) if p.parent == folder)) > MAX_MODULES_PER_FOLDER
    }
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules: {crowded}"
