"""Grafana dashboard JSON model builders: panels, variables, layout.

Plain dicts in the shape of Grafana's dashboard schema (schema version 39,
checked against ``@grafana/schema`` by ``dashboards/schema-check``). Every
panel gets a one-line description that says what the number means and which
phase of serving it belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dashboards import promql, rules
from dashboards.config import Config
from exporters import names

Json = dict[str, Any]

SCHEMA_VERSION = 39
DATASOURCE: Json = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24


class Phase(StrEnum):
    """Which phase of serving a panel's number belongs to."""

    PREFILL = "prefill (time to first token)"
    DECODE = "decode (output tokens after the first)"
    BOTH = "prefill + decode (the whole request)"
    STUTTER = "decode, frozen by another request's prefill"
    REASONING = "reasoning (thinking output before the first answer token)"
    UNTIL_ANSWER = "prefill + reasoning (up to the first answer token)"


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL query of a panel."""

    expr: str
    """The PromQL expression."""
    legend: str = ""
    """Legend format, e.g. ``p99 {{server_address}}``."""
    instant: bool = False
    """Instant query (stat panels) instead of a range query."""
    heatmap: bool = False
    """Return buckets in heatmap format (``le`` labels as rows)."""
    table: bool = False
    """Return one row per series, labels as columns (table panels)."""


def legend(*labels: str) -> str:
    """A legend format showing each of ``labels``: ``{{a}} {{b}}``."""
    return " ".join(f"{{{{{label}}}}}" for label in labels)


def percentiles(
    inst: names.Instrument, sel: str, window: str, by: str, quantiles: Sequence[float]
) -> list[Query]:
    """One quantile query of histogram ``inst`` per label ``by`` for each of ``quantiles``."""
    return [
        Query(promql.quantile(q, inst, sel, window, (by,)), f"p{q * 100:g} {legend(by)}")
        for q in quantiles
    ]


def buckets(inst: names.Instrument, sel: str, window: str) -> Query:
    """A heatmap query: what each bucket of histogram ``inst`` gained over ``window`` (a
    native histogram, which Grafana's heatmap draws itself, or the classic buckets)."""
    return Query(promql.buckets_increase(inst, sel, window), legend("le"), heatmap=True)


def _target(q: Query, ref_id: str) -> Json:
    return {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": q.expr,
        "format": "heatmap" if q.heatmap else "table" if q.table else "time_series",
        "instant": q.instant,
        "legendFormat": q.legend or "__auto",
        "range": not q.instant,
        "refId": ref_id,
    }


def _describe(what: str, phase: Phase) -> str:
    if "\n" in what or not what.endswith("."):
        raise ValueError(f"a description is one sentence ending in '.': {what!r}")
    return f"{what} Phase: {phase}."


def thresholds(*steps: tuple[str, float | None]) -> Json:
    """Absolute thresholds; the first step's value must be ``None`` (the base color)."""
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def line_at(value: float, color: str = "red") -> Json:
    """Thresholds that draw one dashed line at ``value``."""
    return thresholds(("green", None), (color, value))


def _base(kind: str, title: str, description: str, queries: list[Query]) -> Json:
    return {
        "datasource": DATASOURCE,
        "description": description,
        "targets": [_target(q, chr(ord("A") + i)) for i, q in enumerate(queries)],
        "title": title,
        "type": kind,
    }


def timeseries(
    title: str,
    what: str,
    phase: Phase,
    queries: list[Query],
    unit: str,
    *,
    threshold: Json | None = None,
    stack: bool = False,
    maximum: float | None = None,
    overrides: list[Json] | None = None,
) -> Json:
    """A time series panel; ``threshold`` draws dashed lines at its steps."""
    defaults: Json = {
        "color": {"mode": "palette-classic"},
        "custom": {
            "axisPlacement": "auto",
            "axisSoftMin": 0,
            "drawStyle": "line",
            "fillOpacity": 25 if stack else 10,
            "gradientMode": "none",
            "lineInterpolation": "linear",
            "lineWidth": 1,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if stack else "none"},
            "thresholdsStyle": {"mode": "dashed" if threshold else "off"},
        },
        "min": 0,
        "thresholds": threshold or thresholds(("green", None)),
        "unit": unit,
    }
    if maximum is not None:
        defaults["max"] = maximum
    return {
        **_base("timeseries", title, _describe(what, phase), queries),
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {"calcs": [], "displayMode": "list", "placement": "bottom",
                       "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }  # fmt: skip


def heatmap(title: str, what: str, phase: Phase, query: Query, unit: str) -> Json:
    """A heatmap of a Prometheus histogram's buckets (one row per ``le``)."""
    return {
        **_base("heatmap", title, _describe(what, phase), [query]),
        "fieldConfig": {
            "defaults": {
                "custom": {
                    "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                    "scaleDistribution": {"type": "linear"},
                }
            },
            "overrides": [],
        },
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"exponent": 0.5, "fill": "dark-orange", "mode": "scheme", "reverse": False,
                      "scale": "exponential", "scheme": "Oranges", "steps": 64},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "showValue": "never",
            "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": False},
            "yAxis": {"axisPlacement": "left", "reverse": False, "unit": unit},
        },
    }  # fmt: skip


def stat(
    title: str, what: str, phase: Phase, query: Query, unit: str, steps: Json | None = None
) -> Json:
    """A single-number panel with a sparkline; colored by ``steps``."""
    return {
        **_base("stat", title, _describe(what, phase), [query]),
        "fieldConfig": {
            "defaults": {
                "color": {"mode": "thresholds"},
                "thresholds": steps or thresholds(("green", None)),
                "unit": unit,
            },
            "overrides": [],
        },
        "options": {
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "percentChangeColorMode": "standard",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showPercentChange": False,
            "textMode": "auto",
            "wideLayout": True,
        },
    }


def table(
    title: str, what: str, phase: Phase, query: Query, unit: str, labels: dict[str, str], value: str
) -> Json:
    """A table of one instant query: ``labels`` maps labels to headers, in order; the
    value column is headed ``value`` and sorted largest first; the time column is hidden."""
    if not (query.instant and query.table):
        raise ValueError(f"{title}: a table panel needs an instant table query")
    headers = {**labels, "Value": value}
    return {
        **_base("table", title, _describe(what, phase), [query]),
        "fieldConfig": {
            "defaults": {
                "color": {"mode": "thresholds"},
                "custom": {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False},
                "decimals": 0,
                "thresholds": thresholds(("green", None)),
                "unit": unit,
            },
            "overrides": [],
        },
        "options": {
            "cellHeight": "sm",
            "frameIndex": 0,
            "showHeader": True,
            "sortBy": [{"desc": True, "displayName": value}],
        },
        "transformations": [
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "indexByName": {name: i for i, name in enumerate(headers)},
                    "renameByName": headers,
                },
            }
        ],
    }


def right_axis(ref_id: str, unit: str) -> Json:
    """Override that moves every series of query ``ref_id`` to a right-hand axis with ``unit``."""
    return {
        "matcher": {"id": "byFrameRefID", "options": ref_id},
        "properties": [
            {"id": "custom.axisPlacement", "value": "right"},
            {"id": "unit", "value": unit},
        ],
    }


@dataclass(slots=True)
class Layout:
    """Places panels left to right, wrapping at the grid width; numbers them."""

    panels: list[Json] = field(default_factory=list)
    """Placed panels, in order."""
    _x: int = 0
    _y: int = 0
    _row_h: int = 0

    def row(self, title: str) -> None:
        """Start a new (expanded) row."""
        self._newline()
        self.panels.append({"collapsed": False, "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0,
                            "y": self._y}, "id": len(self.panels) + 1, "panels": [],
                            "title": title, "type": "row"})  # fmt: skip
        self._y += 1

    def add(self, panel: Json, w: int, h: int = 8) -> None:
        """Place a panel ``w`` columns wide and ``h`` rows high."""
        if self._x + w > GRID_WIDTH:
            self._newline()
        panel = {**panel, "gridPos": {"h": h, "w": w, "x": self._x, "y": self._y}}
        panel["id"] = len(self.panels) + 1
        self.panels.append(panel)
        self._x += w
        self._row_h = max(self._row_h, h)

    def _newline(self) -> None:
        self._y += self._row_h
        self._x = 0
        self._row_h = 0


def datasource_variable() -> Json:
    """The ``$datasource`` variable: any Prometheus data source."""
    return {"hide": 0, "label": "Data source", "name": "datasource", "query": "prometheus",
            "refresh": 1, "regex": "", "type": "datasource"}  # fmt: skip


def query_variable(name: str, label: str, query: str) -> Json:
    """A multi-value label variable with "All" (``.*``) from a ``label_values`` query."""
    return {
        "allValue": ".*",
        "datasource": DATASOURCE,
        "hide": 0,
        "includeAll": True,
        "label": label,
        "multi": True,
        "name": name,
        "query": query,
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "type": "query",
    }


def request_label_variable(config: Config, name: str, title: str, label: str, *extra: str) -> Json:
    """A variable over the values of ``label`` on the request counter (``extra`` matchers)."""
    query = f"label_values({names.REQUESTS.prom_series}{rules.sel(config, *extra)}, {label})"
    return query_variable(name, title, query)


def tenant_variable(config: Config, *extra: str) -> Json:
    """The ``$tenant`` variable (``promql.TENANT_MATCHER``); only "All" without tenants."""
    return request_label_variable(config, "tenant", "Tenant", promql.TENANT, *extra)


def prometheus_annotation(name: str, expr: str, title: str, text: str, color: str) -> Json:
    """An annotation drawn wherever ``expr`` returns a series (Grafana's Prometheus fields)."""
    return {
        "datasource": DATASOURCE,
        "enable": True,
        "expr": expr,
        "hide": False,
        "iconColor": color,
        "name": name,
        "step": "1m",
        "tagKeys": "server_address",
        "textFormat": text,
        "titleFormat": title,
        "useValueForTime": False,
    }


def dashboard(
    config: Config,
    *,
    uid: str,
    title: str,
    description: str,
    panels: list[Json],
    variables: list[Json],
    annotations: tuple[Json, ...] = (),
) -> Json:
    """The dashboard document; links to the other dashboards sharing its first tag.

    Tags, refresh and time range come from ``config``; the data source variable
    comes first, then ``variables``.
    """
    tags = config.dashboard_tags
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    return {
        "annotations": {"list": [builtin, *annotations]},
        "description": description,
        "editable": True,
        "graphTooltip": 1,
        "links": [{"asDropdown": False, "icon": "external link", "includeVars": True,
                   "keepTime": True, "tags": [tags[0]], "targetBlank": False,
                   "title": "tokenstamp", "tooltip": "", "type": "dashboards"}],
        "panels": panels,
        "refresh": config.dashboard_refresh,
        "schemaVersion": SCHEMA_VERSION,
        "tags": list(tags),
        "templating": {"list": [datasource_variable(), *variables]},
        "time": {"from": config.dashboard_time_from, "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
    }  # fmt: skip
