"""Committed panel queries run as ``promtool test rules`` expression tests.

Grafana's variables are filled in as a dashboard would send them; the input is
synthetic series, one sample a minute for an hour, each growing by a fixed
amount a minute.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
LATENCY = "tokenstamp-serving-latency.json"
STUTTER = "tokenstamp-prefill-stutter.json"


def panel_expr(dashboard: str, title: str, index: int, tenant: str = ".*") -> str:
    """Query ``index`` of panel ``title``, variables filled in (``$tenant`` = ``tenant``)."""
    doc = json.loads((DASHBOARDS / "grafana" / dashboard).read_text(encoding="utf-8"))
    (panel,) = (p for p in doc["panels"] if p["title"] == title)
    expr: str = panel["targets"][index]["expr"]
    for var, value in (("$__rate_interval", "5m"), ("$__range", "1h"), ("$backend", ".*"),
                       ("$model", ".*"), ("$tenant", tenant)):  # fmt: skip
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def promtool_file(series: list[tuple[str, float]], tests: list[dict[str, Any]]) -> str:
    """A unit-test file: ``series`` as (selector, increase a minute), no rule files."""
    return yaml.safe_dump({
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": f"0+{step}x60"} for s, step in series],
            "promql_expr_test": tests,
        }],
    }, sort_keys=False, width=1000)  # fmt: skip


def run_promtool(
    promtool: str, tmp_path: Path, series: list[tuple[str, float]], tests: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    """Write the unit-test file under ``tmp_path`` and run ``promtool test rules`` on it."""
    path = tmp_path / "panels.test.yaml"
    path.write_text(promtool_file(series, tests), encoding="utf-8")
    return subprocess.run(
        [promtool, "test", "rules", path.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
