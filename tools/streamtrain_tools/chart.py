"""Render the Helm chart offline: no cluster, no ``helm`` binary (``make chart``).

The chart is rendered by helm-python-sdk, the Helm Go SDK in-process (the same engine as
``helm template``), with the chart's ``values.schema.json`` checked first. The contract tests
render it through :func:`render` too, so what ``make chart`` shows is what they check.

    python -m streamtrain_tools.chart                        # the manifests on stdout
    python -m streamtrain_tools.chart -f my-values.yaml --out chart-render/
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "streamtrain"
RELEASE = "st"
NAMESPACE = "streamtrain-system"


def render(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    chart: Path = CHART,
) -> dict[str, str]:
    """Every rendered template by its path in the chart (``streamtrain/templates/x.yaml``)."""
    import helm_python as helm  # the Helm Go SDK: a development dependency

    with helm.Chart.load(chart) as loaded:
        loaded.validate_schema(dict(values or {}))
        rendered: dict[str, str] = loaded.render(dict(values or {}), name=name, namespace=namespace)
    return rendered


def objects(values: Mapping[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The rendered Kubernetes objects (NOTES.txt left out), in template path order."""
    out: list[dict[str, Any]] = []
    for path, text in sorted(render(values, **kwargs).items()):
        if not path.endswith(".txt"):
            out += [d for d in yaml.safe_load_all(text) if d]
    return out


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in more.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.chart", description=__doc__.split("\n")[0]
    )
    p.add_argument("-f", "--values", type=Path, action="append", default=[], help="values file")
    p.add_argument("--name", default=RELEASE, help="release name")
    p.add_argument("--namespace", default=NAMESPACE)
    p.add_argument("--out", type=Path, help="write one file per template here (else stdout)")
    args = p.parse_args(argv)
    values: dict[str, Any] = {}
    for path in args.values:
        _merge(values, yaml.safe_load(path.read_text()) or {})
    rendered = render(values, name=args.name, namespace=args.namespace)
    shown = {path: text for path, text in sorted(rendered.items()) if text.strip()}
    if args.out is None:
        for path, text in shown.items():
            if not path.endswith(".txt"):
                sys.stdout.write(f"---\n# Source: {path}\n{text.strip()}\n")
        return 0
    for path, text in shown.items():
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    print(f"rendered {len(shown)} templates of {CHART} into {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
