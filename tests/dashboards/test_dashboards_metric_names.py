"""Every metric a dashboard or rule names is one the proxy exposes (or a recording rule),
and every label it names is one those series carry."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporters import names
from exporters.names import prometheus_series_names

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
DASHBOARD_FILES = sorted((DASHBOARDS / "grafana").glob("*.json"))
RULE_FILES = sorted((DASHBOARDS / "prometheus").glob("*.yaml"))

#: Series Prometheus itself writes for every target.
PROMETHEUS_SERIES = frozenset({"up"})
AGGREGATIONS = frozenset(
    [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ]
)
FUNCTIONS = frozenset(
    {
        "abs",
        "absent",
        "absent_over_time",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_count",
        "histogram_fraction",
        "histogram_quantile",
        "histogram_sum",
        "holt_winters",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log2",
        "log10",
        "max_over_time",
        "min_over_time",
        "predict_linear",
        "quantile_over_time",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sort",
        "sort_desc",
        "sqrt",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "time",
        "timestamp",
        "vector",
    }
)
KEYWORDS = frozenset(
    [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
    ]
)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(
    r"(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[a-z]*)"
    r"|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)(?P<call>\s*\()?"
)
_LABEL_VALUES = re.compile(r"^label_values\((?P<expr>.*),\s*(?P<label>\w+)\)$", re.DOTALL)


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression; raises on an unknown function."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = _GROUPING.sub(r"\1 ()", text)
    text = re.sub(r"\$\{?\w+(?::\w+)?\}?", "", text)
    names = set()
    for m in _TOKEN.finditer(text):
        ident = m.group("ident")
        if ident is None or ident.lower() in KEYWORDS:  # keywords, Inf and NaN: any case
            continue
        if m.group("call") or ident in AGGREGATIONS:
            if ident not in FUNCTIONS | AGGREGATIONS:
                raise ValueError(f"unknown PromQL function {ident!r} in {expr!r}")
            continue
        names.add(ident)
    return names


def test_metric_names_parser():
    expr = (
        'histogram_quantile(0.99, sum by (le, server_address) (rate(a_bucket{le=~"1(\\\\.0)?",'
        ' x="sum(y)"}[$__rate_interval]))) / on (job) group_left (instance) b_total offset 5m'
        " > bool 1e-3 and c:d:e"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c:d:e"}
    with pytest.raises(ValueError, match="histogram_quantil"):
        metric_names("histogram_quantil(0.9, x)")


def _dashboard_exprs(path: Path) -> list[str]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in doc["annotations"]["list"] if "expr" in a]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = _LABEL_VALUES.match(var["query"])
            assert m, var["query"]
            exprs.append(m.group("expr"))
    return exprs


def _rules() -> list[dict[str, Any]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            out.extend(group["rules"])
    return out


def _known() -> frozenset[str]:
    records = {r["record"] for r in _rules() if "record" in r}
    return prometheus_series_names() | records | PROMETHEUS_SERIES


def _names_in(exprs: list[str]) -> set[str]:
    return set().union(*(metric_names(e) for e in exprs))


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_metrics_exist(path):
    used = _names_in(_dashboard_exprs(path))
    assert used, "no metric found: the parser is broken"
    assert used <= _known(), f"unknown metrics: {sorted(used - _known())}"


def test_rule_metrics_exist():
    used = _names_in([r["expr"] for r in _rules()])
    assert used <= _known(), f"unknown metrics: {sorted(used - _known())}"
    # The rules read the exporter's series, not only each other.
    assert used & prometheus_series_names()


def test_a_misspelt_metric_would_be_caught(tmp_path):
    path = DASHBOARD_FILES[0]
    doc = json.loads(path.read_text(encoding="utf-8"))
    target = next(t for p in doc["panels"] for t in p.get("targets", []))
    target["expr"] = (
        target["expr"]
        .replace("tokenstamp_", "tokenstamp_typo_", 1)
        .replace("gen_ai_", "gen_ai_typo_", 1)
    )
    broken = tmp_path / path.name
    broken.write_text(json.dumps(doc), encoding="utf-8")
    assert not _names_in(_dashboard_exprs(broken)) <= _known()


#: Labels Prometheus adds to every series of a target, and the buckets' bound.
PROMETHEUS_LABELS = frozenset({"job", "instance", "le"})
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"')
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\{([^}]*)\}")
_GROUP_LABELS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def _series_labels() -> dict[str, frozenset[str]]:
    """Every exposed sample name and the labels it may carry.

    With ``--tenant-header`` the request metrics also carry the tenant, and the
    stall counter the stalled stream's and the culprit's tenant (the contract
    of the tenants change; ``names.tenant_attrs`` there).
    """
    tenant = names.label_name(names.TENANT)
    culprit = names.label_name(names.CULPRIT_TENANT)
    out: dict[str, frozenset[str]] = {}
    for inst in names.ALL:
        labels = set(inst.prom_labels) | PROMETHEUS_LABELS
        if inst.attrs[: len(names.REQUEST_ATTRS)] == names.REQUEST_ATTRS:
            labels.add(tenant)
        if inst is names.STALLS:
            labels |= {tenant, culprit}
        for suffix in ("", "_bucket", "_sum", "_count", "_total", "_created"):
            out[inst.prom_name + suffix] = frozenset(labels)
    return out


def label_uses(expr: str) -> tuple[list[tuple[str, str]], set[str]]:
    """``(series, label)`` of every matcher, and the labels of grouping clauses."""
    text = re.sub(r"\[[^\]]*\]", "[]", expr)
    matched = [
        (series or "", label)
        for series, body in _SELECTOR.findall(text)
        for label in _MATCHER.findall(body)
    ]
    grouped = {
        label.strip() for body in _GROUP_LABELS.findall(text) for label in body.split(",")
    } - {""}
    return matched, grouped


def test_label_parser():
    matched, grouped = label_uses(
        'sum by (le, a) (rate(x_bucket{b=~"1(\\\\.0)?", c!="}"}[5m])) / on (d) y{e="f"}'
    )
    assert matched == [("x_bucket", "b"), ("x_bucket", "c"), ("y", "e")]
    assert grouped == {"le", "a", "d"}


def _all_exprs() -> list[str]:
    exprs = [r["expr"] for r in _rules()]
    for path in DASHBOARD_FILES:
        exprs += _dashboard_exprs(path)
    return exprs


def test_every_label_exists_on_its_series():
    """A misspelt or misplaced label matches nothing and fails silently: catch it here."""
    series = _series_labels()
    anywhere = frozenset().union(*series.values())
    unknown = []
    for expr in _all_exprs():
        matched, grouped = label_uses(expr)
        for name, label in matched:
            allowed = series.get(name, anywhere)  # recorded series keep exporter labels
            if label not in allowed:
                unknown.append(f"{name}{{{label}}}")
        unknown += sorted(f"by ({label})" for label in grouped - anywhere)
    assert not unknown, f"labels the exporter does not put there: {sorted(set(unknown))}"


def test_a_misplaced_label_would_be_caught():
    series = _series_labels()
    stutter = names.STUTTER_COST.prom_series
    (matched, _) = label_uses(f'{stutter}{{tokenstamp_culprit_tenant="a"}}')
    assert matched == [(stutter, "tokenstamp_culprit_tenant")]
    assert "tokenstamp_culprit_tenant" not in series[stutter]
    assert "tokenstamp_culprit_tenant" in series[names.STALLS.prom_series]
