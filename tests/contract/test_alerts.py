"""The chart's alerting rules: ``promtool check rules`` and ``promtool test rules`` (every
alert fires on the series the operator exports, and stays quiet on a healthy job); the
PrometheusRule renders only when enabled and carries exactly the rules file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "streamtrain"
RULES = CHART / "rules" / "alerts.yaml"
JOB = 'namespace="ads", job="ctr"'
TABLE0 = 'shard="0", table="embedding"'
RAM0 = TABLE0 + ', tier="ram"'
RAM1 = 'shard="1", table="embedding", tier="ram"'


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary is not None, "Debian's prometheus package is needed (.ci/run installs it)"
    return subprocess.run([binary, *args], capture_output=True, text=True, check=False, timeout=60)


def _alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    """The expected alert with its annotations rendered as Alertmanager would get them;
    ``labels``: the alert's labels besides namespace and job (e.g. ``shard``)."""
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == name:
                annotations = {
                    k: v.replace("{{ $labels.namespace }}", "ads")
                    .replace("{{ $labels.job }}", "ctr")
                    .replace('{{ $value | printf "%.4f" }}', "0.7600")
                    .replace("{{ $labels.shard }}", labels.get("shard", ""))
                    for k, v in rule["annotations"].items()
                }
                return {
                    "exp_labels": {
                        "severity": severity,
                        "namespace": "ads",
                        "job": "ctr",
                        **labels,
                    },
                    "exp_annotations": annotations,
                }
    raise KeyError(name)


def test_rules_are_valid() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


def test_every_alert_fires_when_it_should_and_only_then(tmp_path: Path) -> None:
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {  # a failed job
                "interval": "1m",
                "input_series": [
                    {"series": f'streamtrain_job_phase{{{JOB}, phase="Failed"}}', "values": "1x10"}
                ],
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "StreamtrainJobFailed",
                     "exp_alerts": [_alert("StreamtrainJobFailed", "critical")]},
                ],
            },
            {  # waiting for data for 3 hours
                "interval": "1m",
                "input_series": [
                    {"series": f'streamtrain_job_phase{{{JOB}, phase="WaitingForData"}}',
                     "values": "1x200"}
                ],
                "alert_rule_test": [
                    {"eval_time": "1h", "alertname": "StreamtrainDataLate", "exp_alerts": []},
                    {"eval_time": "3h", "alertname": "StreamtrainDataLate",
                     "exp_alerts": [_alert("StreamtrainDataLate", "warning")]},
                ],
            },
            {  # training for 5 hours, a pass a minute for the first hour, then none
                "interval": "1m",
                "input_series": [
                    {"series": f'streamtrain_job_phase{{{JOB}, phase="Training"}}',
                     "values": "1x300"},
                    {"series": f"streamtrain_job_passes_completed_total{{{JOB}}}",
                     "values": "0+1x60 60x240"},
                ],
                "alert_rule_test": [
                    {"eval_time": "2h", "alertname": "StreamtrainNoPassCompleted",
                     "exp_alerts": []},
                    {"eval_time": "4h40m", "alertname": "StreamtrainNoPassCompleted",
                     "exp_alerts": [_alert("StreamtrainNoPassCompleted", "warning")]},
                ],
            },
            {  # three PS restarts within half an hour; worker restarts do not count
                "interval": "1m",
                "input_series": [
                    {"series": f'streamtrain_job_restarts_total{{{JOB}, role="ps"}}',
                     "values": "0x10 1x10 2x10 3x30"},
                    {"series": f'streamtrain_job_restarts_total{{{JOB}, role="worker"}}',
                     "values": "0+1x60"},
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "StreamtrainPSRestarts", "exp_alerts": []},
                    {"eval_time": "50m", "alertname": "StreamtrainPSRestarts",
                     "exp_alerts": [_alert("StreamtrainPSRestarts", "warning")]},
                ],
            },
            {  # AUC 0.79 for a day, then 0.76 for three hours
                "interval": "1m",
                "input_series": [
                    {"series": f"streamtrain_job_auc{{{JOB}}}", "values": "0.79x1440 0.76x180"}
                ],
                "alert_rule_test": [
                    {"eval_time": "23h", "alertname": "StreamtrainAUCDrop", "exp_alerts": []},
                    {"eval_time": "26h", "alertname": "StreamtrainAUCDrop",
                     "exp_alerts": [_alert("StreamtrainAUCDrop", "warning")]},
                ],
            },
            {  # a shard's RAM tier climbs to 90 % of its memoryLimit and stays: the
               # warning comes after 15 minutes above 85 %; an unlimited shard never warns
                "interval": "1m",
                "input_series": [
                    {"series": f'streamtrain_ps_tier_bytes{{{JOB}, {RAM0}}}',
                     "values": "500x30 900x60"},
                    {"series": f'streamtrain_ps_memory_limit_bytes{{{JOB}, shard="0"}}',
                     "values": "1000x90"},
                    {"series": f'streamtrain_ps_tier_bytes{{{JOB}, {RAM1}}}',
                     "values": "900x90"},
                    {"series": f'streamtrain_ps_memory_limit_bytes{{{JOB}, shard="1"}}',
                     "values": "0x90"},
                ],
                "alert_rule_test": [
                    {"eval_time": "40m", "alertname": "StreamtrainPSNearMemoryLimit",
                     "exp_alerts": []},
                    {"eval_time": "60m", "alertname": "StreamtrainPSNearMemoryLimit",
                     "exp_alerts": [_alert("StreamtrainPSNearMemoryLimit", "warning",
                                           shard="0")]},
                ],
            },
            {  # both tiers full: keys evicted under pressure
                "interval": "1m",
                "input_series": [
                    {"series": f'streamtrain_ps_pressure_evictions_total{{{JOB}, {TABLE0}}}',
                     "values": "0x30 0+10x30"},
                ],
                "alert_rule_test": [
                    {"eval_time": "20m", "alertname": "StreamtrainPSEvictingUnderPressure",
                     "exp_alerts": []},
                    {"eval_time": "50m", "alertname": "StreamtrainPSEvictingUnderPressure",
                     "exp_alerts": [_alert("StreamtrainPSEvictingUnderPressure", "warning",
                                           shard="0")]},
                ],
            },
            {  # a day of passes at AUC 0.79, then a quiet night of 8 empty passes (one an
               # hour, no example): the operator leaves the AUC gauge at its last defined
               # value (docs/scheduler.md §5), so neither the AUC nor the pass alert fires
                "interval": "1m",
                "input_series": [
                    {"series": f'streamtrain_job_phase{{{JOB}, phase="Training"}}',
                     "values": "1x1920"},
                    {"series": f"streamtrain_job_auc{{{JOB}}}", "values": "0.79x1920"},
                    {"series": f"streamtrain_job_passes_completed_total{{{JOB}}}",
                     "values": "0+0.0166666667x1920"},
                    {"series": f"streamtrain_job_examples_total{{{JOB}}}",
                     "values": "0+100x1440 144000x480"},
                ],
                "alert_rule_test": [
                    {"eval_time": t, "alertname": name, "exp_alerts": []}
                    for t in ("26h", "29h", "32h")
                    for name in ("StreamtrainAUCDrop", "StreamtrainNoPassCompleted")
                ],
            },
        ],
    }  # fmt: skip
    path = tmp_path / "alerts_test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = _promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_prometheus_rule_renders_only_when_enabled() -> None:
    with helm.Chart.load(CHART) as chart:
        off = chart.render({}, name="st", namespace="monitoring")
        on = chart.render(
            {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}},
            name="st",
            namespace="monitoring",
        )
    assert not (off.get("streamtrain/templates/prometheusrule.yaml") or "").strip()
    rule = yaml.safe_load(on["streamtrain/templates/prometheusrule.yaml"])
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
