"""``streamtrain run --metrics-port``: a local run's Prometheus endpoints and a scrape config.

The run serves the operator's job series (``OperatorMetrics``: phase, passes, AUC, loss,
COPC, waits, exports) on the given port, and each PS shard and worker its own on the ports
after it. ``prometheus.yml`` in the work directory scrapes them all with the labels the
chart's PodMonitor gives pods on Kubernetes (``namespace``, ``job`` = the job's name,
``role``), so the chart's dashboards (``charts/streamtrain/dashboards/``) show a local run
as they show a job on a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from streamtrain_operator.job.spec import Job

FILE_NAME = "prometheus.yml"


def scrape_config(
    job: Job, host: str, run_port: int, components: Sequence[tuple[str, str, int]]
) -> dict[str, Any]:
    """A Prometheus config scraping the run (``run_port``) and ``(role, name, port)``."""

    def labels(role: str) -> list[dict[str, str]]:
        return [
            {"target_label": "namespace", "replacement": job.namespace},
            {"target_label": "job", "replacement": job.name},
            {"target_label": "role", "replacement": role},
        ]

    configs: list[dict[str, Any]] = [
        {
            # The run's series carry namespace and job themselves: kept as they are.
            "job_name": f"streamtrain-{job.name}-run",
            "honor_labels": True,
            "static_configs": [{"targets": [f"{host}:{run_port}"]}],
        }
    ]
    for role in ("ps", "worker"):
        targets = [f"{host}:{port}" for r, _, port in components if r == role]
        if targets:
            configs.append(
                {
                    "job_name": f"streamtrain-{job.name}-{role}",
                    "static_configs": [{"targets": targets}],
                    "relabel_configs": labels(role),
                }
            )
    return {"global": {"scrape_interval": "5s"}, "scrape_configs": configs}


def write_scrape_config(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
