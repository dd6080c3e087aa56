"""``kube.daemon.PodRestarts``: the driver's restart check on Kubernetes.

The driver asks it after every step and the supervisor's watch during long steps; both
share one baseline, so a restart is reported and restored once, whoever sees it first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

from streamtrain_operator.kube.daemon import PodRestarts


class Pods:
    """A fake pod listing: ``state[role][name] = (uid, restarts)``; ``fail`` raises."""

    def __init__(self) -> None:
        self.state: dict[str, dict[str, tuple[str, int]]] = {
            "ps": {"job-ps-0": ("a", 0), "job-ps-1": ("b", 0)},
            "worker": {"job-worker-0": ("c", 0)},
        }
        self.fail = False
        self.reports: list[tuple[str, list[str]]] = []
        self.ready_waits = 0

    def list(self, role: str) -> Mapping[str, tuple[str, int]]:
        if self.fail:
            raise OSError("API unreachable")
        return dict(self.state[role])

    def report(self, role: str, names: Sequence[str]) -> None:
        self.reports.append((role, list(names)))

    async def ready(self) -> None:
        self.ready_waits += 1


def test_a_restart_is_reported_once_whoever_polls_first() -> None:
    pods = Pods()
    restarts = PodRestarts(pods.list, pods.report, pods.ready)

    async def scenario() -> None:
        assert await restarts.poll() == ([], [])  # the baseline
        assert await restarts.heal() == [] and pods.ready_waits == 0
        pods.state["ps"]["job-ps-1"] = ("b", 1)  # container restarted
        pods.state["worker"]["job-worker-0"] = ("c2", 0)  # pod recreated
        assert await restarts.heal() == ["job-ps-1 restarted", "job-worker-0 restarted"]
        assert pods.ready_waits == 1  # the driver's restore talks to serving pods only
        assert await restarts.poll() == ([], [])  # consumed: the watch sees nothing

    asyncio.run(scenario())
    assert (restarts.ps_restarts, restarts.worker_restarts) == (1, 1)
    assert restarts.last_ps_restart == "PS job-ps-1 restarted"
    assert pods.reports == [("ps", ["job-ps-1"]), ("worker", ["job-worker-0"])]


def test_new_pods_and_failed_listings_are_not_restarts() -> None:
    pods = Pods()
    restarts = PodRestarts(pods.list, pods.report)

    async def scenario() -> None:
        await restarts.poll()
        pods.state["worker"]["job-worker-1"] = ("d", 0)  # scaled up
        assert await restarts.poll() == ([], [])
        pods.fail = True
        assert await restarts.heal() == []  # the driver goes on; the next check sees it
        with pytest.raises(OSError):
            await restarts.poll()  # the watch logs it and polls again
        pods.fail = False
        pods.state["ps"]["job-ps-0"] = ("a", 3)
        assert await restarts.poll() == (["job-ps-0"], [])

    asyncio.run(scenario())
    assert restarts.ps_restarts == 1 and restarts.worker_restarts == 0
