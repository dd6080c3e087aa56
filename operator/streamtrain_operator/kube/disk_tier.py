"""The PS pods' disk tier volume (pure, like ``resources``, which mounts it).

A shard whose RAM tier reaches its memory limit moves its coldest keys to an embedded
RocksDB store under ``--disk-path`` (``streamtrain_ps.tier.tiering``). Its pods' root filesystem is
read-only and ``/tmp`` a 1 GiB emptyDir, so the tier gets a volume of its own, sized from
``spec.ps.diskLimit`` plus headroom for compactions: a generic ephemeral volume (one PVC per
pod, of ``spec.ps.diskStorageClass``) or an emptyDir with that ``sizeLimit``.
"""

from __future__ import annotations

from typing import Any

from streamtrain_operator.job.render import ps_memory_limit
from streamtrain_operator.job.spec import Job

#: Where a PS pod mounts its disk tier's volume (passed as ``--disk-path``).
DISK_DIR = "/var/lib/streamtrain/disk"
#: The disk tier's volume holds diskLimit plus this share (at least ``MIN_DISK_HEADROOM``):
#: RocksDB's compactions need transient space beyond the live bytes the cap counts.
DISK_HEADROOM = 0.25
MIN_DISK_HEADROOM = 256 << 20


def disk_volume(job: Job) -> dict[str, Any] | None:
    """The PS pods' disk tier volume, or None when a shard cannot spill (no memory limit
    and no diskLimit). With ``spec.ps.diskStorageClass`` a generic ephemeral volume: a PVC
    per pod, created and deleted with it by Kubernetes (the tier is a spill area wiped at
    start, so nothing should outlive the pod; the operator creates no PVC itself); without
    one an emptyDir, capped at the same size when diskLimit is set."""
    ps = job.spec.ps
    if not ps.diskLimit and not ps_memory_limit(job.spec):
        return None
    if not ps.diskLimit:  # only the filesystem bounds the tier ("0: only the filesystem")
        return {"name": "disk-tier", "emptyDir": {}}
    size = _mebibytes(ps.diskLimit + max(int(ps.diskLimit * DISK_HEADROOM), MIN_DISK_HEADROOM))
    if not ps.diskStorageClass:
        return {"name": "disk-tier", "emptyDir": {"sizeLimit": size}}
    claim = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": ps.diskStorageClass,
        "resources": {"requests": {"storage": size}},
    }
    return {"name": "disk-tier", "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}


def _mebibytes(n: int) -> str:
    """Bytes as a quantity in MiB, rounded up."""
    return f"{-(-n // (1 << 20))}Mi"
