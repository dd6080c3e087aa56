"""``kopf run -m faults.operator_main``: the operator (``streamtrain_operator.main``, its
handlers registered on import) with the fault tests' pause hook (``pause.PauseHook``,
armed by ``STREAMTRAIN_PAUSE``) injected into the :class:`Runtime` it builds at startup."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry

from streamtrain_operator import main
from streamtrain_operator.kube.daemon import Runtime

from .pause import PauseHook

_build_runtime = main.build_runtime


def build_runtime(cfg: main.OperatorConfig, registry: CollectorRegistry) -> Runtime:
    return dataclasses.replace(_build_runtime(cfg, registry), step_hook=PauseHook.from_env())


main.build_runtime = build_runtime
