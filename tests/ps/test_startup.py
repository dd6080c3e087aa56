"""The start-up line: what ``announce`` prints, ``listening_address`` reads back."""

from __future__ import annotations

import io

import pytest

from streamtrain_ps.plumbing.startup import LISTENING, announce, listening_address


@pytest.mark.parametrize("address", ["127.0.0.1:50051", "[::]:7000", "ps-0.ps.ns.svc:9000"])
def test_announce_then_parse_round_trips(address: str) -> None:
    out = io.StringIO()
    announce(address, "shard 0 of 2", out=out)
    (line,) = out.getvalue().splitlines()
    assert line == f"listening on {address} (shard 0 of 2)"
    assert listening_address(line) == address
    match = LISTENING.search(line)
    assert match is not None and match.group(1) == address


def test_other_lines_are_not_start_up_lines() -> None:
    assert listening_address("metrics on http://127.0.0.1:9100/metrics") is None
    assert listening_address("listening on nowhere") is None
    assert listening_address("listening on host:12ab") is None
    assert listening_address("") is None


def test_announce_refuses_what_no_launcher_could_parse() -> None:
    with pytest.raises(ValueError, match="not a HOST:PORT address: 'localhost'"):
        announce("localhost", out=io.StringIO())
