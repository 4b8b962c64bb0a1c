"""Each dashboard type-checks against Grafana's published schema (``@grafana/schema``, ``tsc``)."""

from __future__ import annotations

import copy
import shutil
from typing import Any

import pytest

from dashboards import schema_check

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="node and npm are not installed: the Grafana schema check runs tsc under node",
)


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    # Installs the pinned npm packages on first use (npm ci); a failure here is a failure.
    schema_check.ensure_node_modules()
    return schema_check.committed_dashboards()


def test_committed_dashboards_match_the_grafana_schema(committed):
    assert set(committed) == {
        "tokenstamp-prefill-stutter.json",
        "tokenstamp-serving-latency.json",
    }
    result = schema_check.check(committed)
    assert result.returncode == 0, result.stdout + result.stderr


def _first(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(p for p in doc["panels"] if p["type"] == kind)


def _broken(committed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    doc = committed["tokenstamp-serving-latency.json"]
    cases = {}
    wrong_type = copy.deepcopy(doc)
    _first(wrong_type, "timeseries")["gridPos"]["h"] = "8"
    cases["gridPos.h is a string"] = wrong_type
    bad_enum = copy.deepcopy(doc)
    _first(bad_enum, "timeseries")["fieldConfig"]["defaults"]["custom"]["drawStyle"] = "lines"
    cases["drawStyle is not a GraphDrawStyle"] = bad_enum
    unknown = copy.deepcopy(doc)
    _first(unknown, "stat")["options"]["sparkline"] = True
    cases["stat has no option 'sparkline'"] = unknown
    missing = copy.deepcopy(doc)
    del _first(missing, "heatmap")["options"]["yAxis"]
    cases["heatmap without yAxis"] = missing
    small = copy.deepcopy(committed["tokenstamp-prefill-stutter.json"])
    _first(small, "table")["options"]["cellHeight"] = "small"
    cases["table cellHeight is not a TableCellHeight"] = small
    return cases


@pytest.mark.parametrize(
    "case",
    [
        "gridPos.h is a string",
        "drawStyle is not a GraphDrawStyle",
        "stat has no option 'sparkline'",
        "heatmap without yAxis",
        "table cellHeight is not a TableCellHeight",
    ],
)
def test_a_broken_dashboard_fails_the_check(committed, case):
    """The check cannot pass silently: each kind of mistake is a tsc error."""
    result = schema_check.check({"broken.json": _broken(committed)[case]})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "error TS" in output
