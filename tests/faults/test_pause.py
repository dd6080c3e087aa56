"""The fault tests' pause hook: parsing, and where ``parts:`` holds (inside an export)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.run.hooks import PARTS

from .pause import PauseHook


def test_parts_is_only_for_models_and_a_bad_value_names_the_forms(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STREAMTRAIN_PAUSE_FILE", str(tmp_path / "paused"))
    monkeypatch.setenv("STREAMTRAIN_PAUSE", "parts:delta@2")
    hook = PauseHook.from_env()
    assert (hook.when, hook.step, hook.pass_index) == (PARTS, "delta", 2)
    bad_values = ("parts:train", "parts:checkpoint", "during:delta", "parts:delta@x")
    for bad in (*bad_values, "manifest:train"):
        monkeypatch.setenv("STREAMTRAIN_PAUSE", bad)
        with pytest.raises(ValueError, match=r"parts:<delta\|base\|batch>"):
            PauseHook.from_env()
    monkeypatch.delenv("STREAMTRAIN_PAUSE")
    assert PauseHook.from_env().when == ""  # unset: a no-op


def test_hold_waits_at_the_matching_model_only_and_only_once(tmp_path: Path) -> None:
    path = tmp_path / "paused"
    hook = PauseHook(PARTS, "delta", 2, str(path))

    async def scenario() -> None:
        # Other steps, passes or hold points go straight through.
        await hook.hold("after", StepKey("20261101", 2, StepKind.DELTA))
        await hook.hold(PARTS, StepKey("20261101", 1, StepKind.DELTA))
        await hook.hold(PARTS, StepKey("20261101", 2, StepKind.BASE))
        assert not path.exists()
        held = asyncio.create_task(hook.hold(PARTS, StepKey("20261101", 2, StepKind.DELTA)))
        for _ in range(200):  # poll (bounded) until the hook has written its file
            if path.exists():
                break
            await asyncio.sleep(0.01)
        assert path.read_text() == "parts delta 20261101/2\n"
        assert not held.done()
        path.unlink()  # release
        await asyncio.wait_for(held, 5)
        await hook.hold(PARTS, StepKey("20261101", 2, StepKind.DELTA))  # fired: no hold
        assert not path.exists()

    asyncio.run(scenario())
