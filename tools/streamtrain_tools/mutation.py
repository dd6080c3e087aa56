"""``make test-mutants``: a mutmut run over the core invariants, in a staged tree.

mutmut names a mutant by its file's path (``operator/streamtrain_operator/job/x.py`` →
``operator.streamtrain_operator.job.x``, a ``src.`` prefix stripped) and matches it against
the modules the tests import (``streamtrain_operator.job.x``), so it needs one source root
named ``src`` (or the repository root); ours are three folders side by side. This builds
``.mutation/`` with a copy of the packages as ``src/streamtrain_*``, ``tests`` and what the
tests read (``crds``, ``charts``, ``examples``, ``data``) linked, and a
``pyproject.toml`` whose ``[tool.mutmut]`` is the repository's with ``ps/``, ``worker/``,
``operator/`` and ``tools/`` read as ``src/``, and whose pytest path is ``src`` and
``tests``; then runs ``mutmut run [MUTANTS...]`` and ``mutmut results`` there.

``python -m streamtrain_tools.mutation [--tests FILE...] [MUTANT_NAME_GLOBS...]``
(``--tests``: a short run's own test selection); the survivors are listed
by ``mutmut results`` (and ``cd .mutation && mutmut show NAME`` shows one).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".mutation"
PACKAGES = {
    "ps": "streamtrain_ps",
    "worker": "streamtrain_worker",
    "operator": "streamtrain_operator",
    "tools": "streamtrain_tools",
}
#: What the tests read besides the packages.
ALSO = ("tests", "crds", "charts", "examples", "data")


def _to_src(path: str) -> str:
    """``operator/streamtrain_operator/x.py`` -> ``src/streamtrain_operator/x.py``."""
    return re.sub(r"^(ps|worker|operator|tools)/", "src/", path)


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def staged_pyproject(project: dict[str, Any], tests: Sequence[str] = ()) -> str:
    """The staged tree's ``pyproject.toml``: pytest's settings, mutmut's with ``src/``
    (``tests``: run these instead of the configured selection)."""
    pytest_ini = dict(project["tool"]["pytest"]["ini_options"])
    pytest_ini["pythonpath"] = ["src", "tests"]
    mutmut = dict(project["tool"]["mutmut"])
    mutmut["source_paths"] = ["src"]
    mutmut["only_mutate"] = [_to_src(p) for p in mutmut.get("only_mutate", [])]
    mutmut["also_copy"] = [name for name in ALSO if name != "tests"]  # tests: mutmut's default
    if tests:
        mutmut["pytest_add_cli_args_test_selection"] = list(tests)
    lines = ["[tool.pytest.ini_options]"]
    lines += [f"{k} = {_toml(v)}" for k, v in pytest_ini.items()]
    lines += ["", "[tool.mutmut]"]
    lines += [f"{k} = {_toml(v)}" for k, v in mutmut.items()]
    return "\n".join(lines) + "\n"


def stage(tests: Sequence[str] = ()) -> Path:
    """(Re)build ``.mutation/``; mutmut's own ``mutants/`` cache in it is kept."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (STAGE / "src").mkdir(parents=True, exist_ok=True)
    for folder, package in PACKAGES.items():  # copied: mutmut does not follow links
        target = STAGE / "src" / package
        if target.is_symlink():
            target.unlink()
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(
            ROOT / folder / package, target, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ALSO:
        _link(STAGE / name, ROOT / name)
    (STAGE / "pyproject.toml").write_text(staged_pyproject(project, tests))
    return STAGE


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        if link.is_symlink() and link.resolve() == target.resolve():
            return
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        else:
            link.unlink()
    link.symlink_to(target, target_is_directory=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamtrain_tools.mutation")
    parser.add_argument("mutants", nargs="*", help="mutant name globs (default: every one)")
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument(
        "--tests", nargs="*", default=(), help="test files to run instead of the configured ones"
    )
    args = parser.parse_args(argv)
    where = stage(args.tests)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the staged code only
    mutmut = [sys.executable, "-m", "mutmut"]
    run = [*mutmut, "run", "--max-children", str(args.max_children), *args.mutants]
    code = subprocess.run(run, cwd=where, env=env, check=False).returncode
    subprocess.run([*mutmut, "results"], cwd=where, env=env, check=False)
    return code


if __name__ == "__main__":
    sys.exit(main())
