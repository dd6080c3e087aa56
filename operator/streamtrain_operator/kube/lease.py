"""One driver per job: a ``coordination.k8s.io/v1`` Lease fences it.

Two operator pods can run at once — a rolling update, a second Deployment, an old pod cut
off from the API but not yet killed — and the Deployment's ``Recreate`` strategy does not
stop that. Each would start a driver for the same job: both would train the same passes
on the same PS and publish the same models, and their unconditional status merge-patches
would overwrite each other's progress. So a job is driven only by the holder of its Lease
``<job>-driver`` (in the job's namespace):

- **acquire** before anything that writes (children, status, the driver): read the Lease;
  absent, create it (a create that loses the race gets 409); held by us, or expired
  (``renewTime + leaseDurationSeconds`` in the past), take it over with a write (a
  merge-patch of the whole spec) that carries the read's ``resourceVersion`` — the API
  server refuses it (409) if anyone wrote the Lease in between, so of two operators taking
  over at once exactly one wins; held by another and fresh: not ours, wait and look again.
- **renew** every third of the duration, the same conditional write; a refused or failed
  renewal, or a renewal that did not land within the duration, ends the driver's run.
- **fence**: every progress write (``StatusStore``) first checks that the last successful
  renewal is younger than the duration minus a margin (:meth:`DriverLease.check`); if not,
  it raises :class:`LeaseLost` and the write does not happen, so a driver that lost its
  Lease records nothing more — and the next run of the holder reloads from what the
  record says. The margin covers the renewal's own round trip and clock drift between
  operator pods (``leaseDurationSeconds`` 30, margin 5 s).
- **release** when the daemon stops (operator shutdown, job deleted): the holder is
  cleared, so a replacement pod takes over at once instead of after the duration.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

DURATION_SECONDS = 30
#: Time a write needs to land after the check (a status patch's round trip, clock drift).
MARGIN_SECONDS = 5.0


class LeaseLost(RuntimeError):  # noqa: N818 - a state, raised to stop the driver
    """This operator no longer holds the job's Lease: it must not write anything more."""


class LeaseConflict(RuntimeError):  # noqa: N818 - the API server's 409
    """The Lease changed since it was read (or was created meanwhile)."""


class LeaseAPI(Protocol):
    """The Lease calls (``kube.api.Kube``): read (``None`` if absent), create, replace
    (``LeaseConflict`` on a 409: the ``resourceVersion`` in the body is not the current one)."""

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def replace_lease(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]: ...


def lease_name(job_name: str) -> str:
    return f"{job_name}-driver"


def micro_time(epoch_seconds: float) -> str:
    """Kubernetes ``MicroTime`` (UTC, microseconds, ``Z``)."""
    moment = dt.datetime.fromtimestamp(epoch_seconds, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def claimable(lease: Mapping[str, Any], holder: str, now: float) -> bool:
    """May ``holder`` take ``lease`` now? Its own, released, or expired."""
    spec = lease.get("spec") or {}
    current = spec.get("holderIdentity") or ""
    if current in ("", holder):
        return True
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or DURATION_SECONDS)
    return renewed is None or renewed + duration < now


@dataclass
class DriverLease:
    """The Lease of one job, as one operator (``holder``) sees it."""

    api: LeaseAPI
    namespace: str
    job_name: str
    holder: str
    clock: Callable[[], float]
    duration: float = DURATION_SECONDS
    margin: float = MARGIN_SECONDS

    def __post_init__(self) -> None:
        #: When the last acquire or renewal that landed was sent (``None``: not held).
        self._renewed: float | None = None
        self._version = ""
        self._acquired: str | None = None

    @property
    def name(self) -> str:
        return lease_name(self.job_name)

    def _body(self, now: float, holder: str, acquired: str | None) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": int(self.duration),
                "acquireTime": acquired or micro_time(now),
                "renewTime": micro_time(now),
            },
        }

    def _replace(self, body: dict[str, Any]) -> None:
        body["metadata"]["resourceVersion"] = self._version
        written = self.api.replace_lease(self.namespace, self.name, body)
        self._version = str(written.get("metadata", {}).get("resourceVersion", ""))
        self._acquired = body["spec"]["acquireTime"]

    def acquire(self) -> bool:
        """Take the Lease if it is free, ours or expired; ``False`` if another holds it."""
        now = self.clock()
        current = self.api.read_lease(self.namespace, self.name)
        try:
            if current is None:
                body = self._body(now, self.holder, None)
                written = self.api.create_lease(self.namespace, body)
                self._version = str(written.get("metadata", {}).get("resourceVersion", ""))
                self._acquired = body["spec"]["acquireTime"]
            elif claimable(current, self.holder, now):
                self._version = str(current.get("metadata", {}).get("resourceVersion", ""))
                spec = current.get("spec") or {}
                ours = spec.get("holderIdentity") == self.holder
                self._replace(
                    self._body(now, self.holder, spec.get("acquireTime") if ours else None)
                )
            else:
                self._renewed = None
                return False
        except LeaseConflict:
            self._renewed = None
            return False
        self._renewed = now
        return True

    def renew(self) -> None:
        """Extend the Lease; :class:`LeaseLost` if it is no longer ours."""
        now = self.clock()
        if self._renewed is None:
            raise LeaseLost(f"lease {self.namespace}/{self.name} is not held by {self.holder}")
        try:
            self._replace(self._body(now, self.holder, self._acquired))
        except LeaseConflict as exc:
            self._renewed = None
            raise LeaseLost(f"lease {self.namespace}/{self.name} was taken over") from exc
        self._renewed = now

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless a write sent now lands while the Lease is ours."""
        renewed = self._renewed
        if renewed is None or self.clock() > renewed + self.duration - self.margin:
            self._renewed = None
            raise LeaseLost(
                f"lease {self.namespace}/{self.name}: not renewed within {self.duration:.0f}s"
            )

    def release(self) -> None:
        """Clear the holder (best effort) so another operator need not wait the duration."""
        if self._renewed is None:
            return
        self._renewed = None
        try:
            self._replace(self._body(self.clock(), "", None))
        except Exception:  # taken over already, or the API is away: it expires anyway
            log.warning("lease %s/%s not released", self.namespace, self.name, exc_info=True)
