"""Operator metrics: names and labels (namespace/job/role only), state-set phase, series
removed when a job is deleted; and the operator's settings from the environment."""

from __future__ import annotations

import kopf
import pytest
from prometheus_client import CollectorRegistry

from streamtrain_operator import main
from streamtrain_operator.kube.metrics import OperatorMetrics


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in registry.collect()
        for s in m.samples
    }


def test_series_names_labels_and_values() -> None:
    registry = CollectorRegistry()
    m = OperatorMetrics(registry)
    m.set_phase("ads", "ctr", "WaitingForData")
    m.set_phase("ads", "ctr", "Training")  # a state set: the old phase series goes away
    m.pass_completed(
        "ads", "ctr", duration_seconds=95, wait_seconds=12,
        metrics={"auc": 0.79, "loss": 0.44, "copc": 1.01, "examples": 1000.0,
                 "skippedFiles": 3.0},
    )  # fmt: skip
    m.restarted("ads", "ctr", "ps")
    m.exported("ads", "ctr")
    get = registry.get_sample_value
    job = {"namespace": "ads", "job": "ctr"}
    assert get("streamtrain_job_phase", {**job, "phase": "Training"}) == 1
    assert get("streamtrain_job_phase", {**job, "phase": "WaitingForData"}) is None
    assert get("streamtrain_job_auc", job) == 0.79
    assert get("streamtrain_job_copc", job) == 1.01
    assert get("streamtrain_job_examples_total", job) == 1000
    assert get("streamtrain_job_skipped_files_total", job) == 3
    assert get("streamtrain_job_passes_completed_total", job) == 1
    assert get("streamtrain_job_pass_duration_seconds_bucket", {**job, "le": "120.0"}) == 1
    assert get("streamtrain_job_pass_duration_seconds_bucket", {**job, "le": "60.0"}) == 0
    assert get("streamtrain_job_donefile_wait_seconds_sum", job) == 12
    assert get("streamtrain_job_restarts_total", {**job, "role": "ps"}) == 1
    allowed = {"namespace", "job", "role", "phase", "le"}
    for (name, labels), _ in _samples(registry).items():
        assert name.startswith("streamtrain_job_")
        assert {k for k, _ in labels} <= allowed, name
    with pytest.raises(ValueError, match="role"):
        m.restarted("ads", "ctr", "scheduler")


def test_forget_removes_only_that_jobs_series() -> None:
    registry = CollectorRegistry()
    m = OperatorMetrics(registry)
    for job in ("a", "b"):
        m.set_phase("ads", job, "Training")
        m.pass_completed("ads", job, duration_seconds=1, wait_seconds=0, metrics={"auc": 0.6})
        m.checkpointed("ads", job)
    m.restarted("ads", "a", "worker")
    m.forget("ads", "a")
    jobs = {dict(labels).get("job") for (_, labels) in _samples(registry)}
    assert jobs == {"b"}
    m.forget("ads", "never-seen")  # no error for a job without series


def test_settings_from_the_environment_name_the_bad_variable() -> None:
    cfg = main.OperatorConfig.from_env(
        {
            "POD_NAMESPACE": "ops",
            "STREAMTRAIN_PS_PORT": "6000",
            "STREAMTRAIN_NETWORK_POLICY": "false",
            "STREAMTRAIN_OPERATOR_LABELS": '{"app.kubernetes.io/name": "st"}',
            "STREAMTRAIN_ENDPOINT_MAP": '{"a.svc:1": "127.0.0.1:2"}',
        }
    )
    options = cfg.options()
    assert options.ps_port == 6000 and options.network_policy is False
    assert options.operator_namespace == "ops"
    assert dict(options.operator_labels) == {"app.kubernetes.io/name": "st"}
    assert cfg.endpoint_map == {"a.svc:1": "127.0.0.1:2"}
    assert main.OperatorConfig.from_env({}) == main.OperatorConfig()
    for env, name in (
        ({"STREAMTRAIN_PS_PORT": "x"}, "STREAMTRAIN_PS_PORT"),
        ({"STREAMTRAIN_PS_PORT": "0"}, "STREAMTRAIN_PS_PORT"),
        ({"STREAMTRAIN_NETWORK_POLICY": "maybe"}, "STREAMTRAIN_NETWORK_POLICY"),
        ({"STREAMTRAIN_OPERATOR_LABELS": "[1]"}, "STREAMTRAIN_OPERATOR_LABELS"),
        ({"STREAMTRAIN_ENDPOINT_MAP": "{"}, "STREAMTRAIN_ENDPOINT_MAP"),
    ):
        with pytest.raises(main.SettingsError, match=name):
            main.OperatorConfig.from_env(env)


def test_kopf_settings_use_our_prefixes_and_timeouts() -> None:
    settings = kopf.OperatorSettings()
    main.configure(
        settings, main.OperatorConfig(watch_timeout_seconds=120, request_timeout_seconds=30)
    )
    assert settings.persistence.finalizer == "streamtrain.io/finalizer"
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.progress_storage.prefix == "streamtrain.io"
    assert settings.watching.server_timeout == 120
    assert settings.networking.request_timeout == 30
    assert settings.scanning.disabled is True


def test_a_pass_without_a_defined_metric_leaves_its_gauge_at_the_last_defined_value() -> None:
    """An empty pass (or one class only) is counted, but never sets a placeholder or NaN."""
    registry = CollectorRegistry()
    m = OperatorMetrics(registry)
    job = {"namespace": "ads", "job": "ctr"}
    m.pass_completed(
        "ads",
        "ctr",
        duration_seconds=60,
        wait_seconds=0,
        metrics={"auc": 0.79, "loss": 0.44, "copc": 1.01, "examples": 1000.0},
    )
    m.pass_completed("ads", "ctr", duration_seconds=1, wait_seconds=0, metrics={"examples": 0.0})
    nan = float("nan")
    m.pass_completed(
        "ads", "ctr", duration_seconds=1, wait_seconds=0, metrics={"auc": nan, "loss": 0.5}
    )
    get = registry.get_sample_value
    assert get("streamtrain_job_auc", job) == 0.79
    assert get("streamtrain_job_copc", job) == 1.01
    assert get("streamtrain_job_loss", job) == 0.5  # defined by the third pass
    assert get("streamtrain_job_passes_completed_total", job) == 3
    assert get("streamtrain_job_examples_total", job) == 1000
