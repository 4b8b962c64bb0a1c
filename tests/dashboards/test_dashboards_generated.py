"""The committed files are what the generator makes, and the dashboards are well formed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dashboards import alerts, build, promql, rules
from dashboards.config import BurnWindow, Config, Severity
from dashboards.grafana import GRID_WIDTH, Phase
from dashboards.promql import TENANT_MATCHER
from exporters import names

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"


def test_regenerate_and_diff(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "dashboards.build", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    generated = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.*"))
    assert generated == sorted(build.render(Config()))
    for rel in generated:
        fresh = (tmp_path / rel).read_text(encoding="utf-8")
        committed = (DASHBOARDS / rel).read_text(encoding="utf-8")
        assert fresh == committed, f"{rel} is stale: run `python -m dashboards.build`"


def test_check_mode_reports_stale_files(tmp_path):
    build.write(Config(), tmp_path)
    assert build.main(["--check", "--out", str(tmp_path)]) == 0
    stale = tmp_path / build.ALERTS_FILE
    stale.write_text(stale.read_text(encoding="utf-8").replace("0.05", "0.5"), encoding="utf-8")
    assert build.main(["--check", "--out", str(tmp_path)]) == 1


def _dashboards() -> dict[str, dict[str, Any]]:
    return {
        p.name: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((DASHBOARDS / "grafana").glob("*.json"))
    }


def _panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in doc["panels"] if p["type"] != "row"]


@pytest.mark.parametrize("name", sorted(_dashboards()))
def test_every_panel_says_what_and_which_phase(name):
    doc = _dashboards()[name]
    phases = {f"Phase: {p}." for p in Phase}
    for panel in _panels(doc):
        description = panel["description"]
        assert "\n" not in description, panel["title"]
        assert any(description.endswith(p) for p in phases), panel["title"]
        assert len(description) > len("Phase: decode.") + 20, panel["title"]


@pytest.mark.parametrize("name", sorted(_dashboards()))
def test_layout_ids_and_datasource(name):
    doc = _dashboards()[name]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for panel in doc["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= GRID_WIDTH, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
    for panel in _panels(doc):
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    variables = [v["name"] for v in doc["templating"]["list"]]
    assert variables[:2] == ["datasource", "backend"]
    assert variables[-1] == "tenant"


@pytest.mark.parametrize("name", sorted(_dashboards()))
def test_tenant_variable_matches_series_without_the_label(name):
    """ "All" is ``.*``: it matches the empty value, so series without a tenant still show."""
    tenant = _dashboards()[name]["templating"]["list"][-1]
    assert tenant["query"].startswith(f"label_values({names.REQUESTS.prom_series}{{")
    assert tenant["query"].endswith(", tokenstamp_tenant)")
    assert 'server_address=~"$backend"' in tenant["query"]
    assert (tenant["includeAll"], tenant["multi"], tenant["allValue"]) == (True, True, ".*")
    assert re.fullmatch(tenant["allValue"], "")


#: Instruments whose series carry ``tokenstamp_tenant`` with ``--tenant-header``: the
#: request metrics, and the stall counter (the contract of ``names.tenant_attrs``).
TENANT_LABELLED = {
    inst.prom_name
    for inst in names.ALL
    if inst.attrs[: len(names.REQUEST_ATTRS)] == names.REQUEST_ATTRS or inst is names.STALLS
}
#: Panels that read such a series without the tenant filter, on purpose.
TENANT_UNFILTERED = {
    # Backend-wide: the decode step depends on every open stream, whoever's.
    ("tokenstamp-prefill-stutter.json", "Step now, and with one chunk of prefill"),
    # The tenant is fixed to "other" there.
    ("tokenstamp-serving-latency.json", "Requests folded into other"),
}
_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})")


def _family(series: str) -> str:
    for suffix in ("_bucket", "_sum", "_count", "_total"):
        if series.endswith(suffix) and series.removesuffix(suffix) in TENANT_LABELLED:
            return series.removesuffix(suffix)
    return series


@pytest.mark.parametrize("name", sorted(_dashboards()))
def test_every_request_metric_query_is_filtered_by_tenant(name):
    """The tenant variable reaches every panel query over a series that can carry a tenant."""
    checked = 0
    for panel in _panels(_dashboards()[name]):
        for target in panel["targets"]:
            for series, sel in _SELECTOR.findall(target["expr"]):
                if _family(series) not in TENANT_LABELLED:
                    continue
                checked += 1
                if (name, panel["title"]) in TENANT_UNFILTERED:
                    assert TENANT_MATCHER not in sel, panel["title"]
                else:
                    assert TENANT_MATCHER in sel or 'tokenstamp_culprit_tenant=~"$tenant"' in sel, (
                        f"{panel['title']}: {series}{sel}"
                    )
    assert checked > 10


def test_tenant_panels():
    latency = _dashboards()["tokenstamp-serving-latency.json"]
    stutter = _dashboards()["tokenstamp-prefill-stutter.json"]
    titles = {p["title"]: p for p in _panels(latency) + _panels(stutter)}
    for title in ("Goodput by tenant", "Goodput by SLO source", "Tenant goodput burn rate",
                  "TTFT p90 by tenant", "TPOT p90 by tenant", "Requests folded into other",
                  "Who stalls whom", "Stutter cost by culprit tenant"):  # fmt: skip
        assert title in titles, title
    goodput = titles["Goodput by tenant"]["targets"][0]["expr"]
    assert "sum by (tokenstamp_tenant)" in goodput
    assert 'tokenstamp_slo="met"' in goodput
    assert "label_replace(" in goodput  # one named line without tenants, not an empty legend
    source = titles["Goodput by SLO source"]["targets"][0]["expr"]
    assert "sum by (tokenstamp_slo_source)" in source
    whom = titles["Who stalls whom"]
    assert whom["type"] == "table"
    (query,) = whom["targets"]
    assert (query["instant"], query["range"], query["format"]) == (True, False, "table")
    assert "sum by (tokenstamp_culprit_tenant, tokenstamp_tenant)" in query["expr"]
    assert "increase(tokenstamp_stalls_total{" in query["expr"]
    assert "[$__range]" in query["expr"]
    cost = titles["Stutter cost by culprit tenant"]["targets"][0]["expr"]
    assert "sum by (tokenstamp_tenant) (rate(tokenstamp_prefill_stutter_cost_seconds_total{" in cost
    burn = titles["Tenant goodput burn rate"]["targets"][0]["expr"]
    assert burn.startswith(rules.record_name(rules.TENANT_GOODPUT_ERRORS, "1h"))


def test_serving_latency_variables_and_panels():
    doc = _dashboards()["tokenstamp-serving-latency.json"]
    assert [v["name"] for v in doc["templating"]["list"]] == [
        "datasource", "backend", "model", "tenant",
    ]  # fmt: skip
    exprs = "\n".join(t["expr"] for p in _panels(doc) for t in p["targets"])
    for inst in (names.TTFT, names.TPOT, names.GAP, names.MAX_GAP, names.DURATION,
                 names.PREFIX_CACHE_TTFT, names.TOKENS_PER_EVENT,
                 names.ACCEPTANCE_LENGTH, names.ANSWER_TTFT, names.REASONING_DURATION,
                 names.REASONING_TOKENS, names.TOOL_CALL_TTF):  # fmt: skip
        assert inst.prom_name in exprs, inst.name
    for series in ("tokenstamp_requests_total", "tokenstamp_streams_active",
                   "tokenstamp_requests_slo_total", "gen_ai_client_token_usage_sum"):  # fmt: skip
        assert series in exprs
    assert 'server_address=~"$backend"' in exprs
    assert 'gen_ai_request_model=~"$model"' in exprs
    assert "tokenstamp_prefix_cache" in exprs
    assert {p["type"] for p in _panels(doc)} == {"stat", "timeseries", "heatmap"}
    assert 'tokenstamp_tenant=~"$tenant"' in exprs


def _row(doc: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels under the row ``title``, up to the next row."""
    panels = doc["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title)
    out = []
    for panel in panels[start + 1 :]:
        if panel["type"] == "row":
            break
        out.append(panel)
    return out


def test_thinking_vs_answering_row():
    config = Config()
    doc = _dashboards()["tokenstamp-serving-latency.json"]
    row = {p["title"]: p for p in _row(doc, "Thinking vs answering")}
    assert set(row) == {
        "TTFT and time to first answer p50 / p90", "Reasoning duration p50 / p90",
        "Reasoning share of output tokens", "Time to first tool call p90",
        "Time to first answer SLO misses",
    }  # fmt: skip
    # TTFT and the answer side by side, at the same quantiles, per backend: native
    # histograms first, classic buckets where a backend has none.
    pairs = row["TTFT and time to first answer p50 / p90"]["targets"]
    for q in ("0.5", "0.9"):
        for inst in (names.TTFT, names.ANSWER_TTFT):
            (target,) = (
                t for t in pairs
                if t["expr"].startswith(f"histogram_quantile({q}, (\n  sum by (server_address) "
                                        f"(rate({inst.prom_name}{{")
            )  # fmt: skip
            assert "\nor ignoring (le)\n" in target["expr"]
            assert f"sum by (le, server_address) (rate({inst.prom_name}_bucket{{" in target["expr"]
            assert "{{server_address}}" in target["legendFormat"]
    lines = [s["value"] for s in row["TTFT and time to first answer p50 / p90"]["fieldConfig"]
             ["defaults"]["thresholds"]["steps"]]  # fmt: skip
    assert lines == [None, config.ttft_target_s, config.answer_ttft_target_s]
    # Reasoning tokens over all output tokens, 0 (not absent) for a backend without reasoning.
    (share,) = row["Reasoning share of output tokens"]["targets"]
    part, whole = share["expr"].split("\nor\n  0 * ")
    reasoning = names.REASONING_TOKENS.prom_name
    assert f"histogram_sum(sum by (server_address) (rate({reasoning}{{" in part
    assert f"rate({reasoning}_sum{{" in part
    assert "gen_ai_client_token_usage{" in whole
    assert "gen_ai_client_token_usage_sum{" in whole
    assert share["expr"].count('gen_ai_token_type="output"') == 4  # native and classic, twice
    (misses,) = row["Time to first answer SLO misses"]["targets"]
    answer = promql.num(config.answer_ttft_target_s)
    assert f"histogram_fraction(-Inf, {answer}, " in misses["expr"]
    assert f"{names.ANSWER_TTFT.prom_name}_bucket{{" in misses["expr"]
    assert promql.le_matcher(config.answer_ttft_target_s) in misses["expr"]
    burn = next(p for p in _panels(doc) if p["title"] == "Time to first answer SLO burn rate")
    assert burn["targets"][0]["expr"].startswith(rules.record_name(rules.ANSWER_TTFT_ERRORS, "1h"))


def test_prefill_stutter_thresholds_and_annotations():
    config = Config()
    doc = _dashboards()["tokenstamp-prefill-stutter.json"]
    lines = {
        step["value"]
        for p in _panels(doc)
        for step in p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
        if step["value"] is not None
    }
    assert config.stutter_share_threshold in lines
    assert config.unattributed_share_threshold in lines
    bursts = [a for a in doc["annotations"]["list"] if "expr" in a]
    assert len(bursts) == 1
    assert names.STUTTER_COST.prom_series in bursts[0]["expr"]
    titles = " ".join(p["title"] for p in _panels(doc))
    assert "TTFT next to prefill stall rate" in titles


def test_rate_le_is_exact_on_a_bucket_and_interpolates_between():
    sel = promql.matchers('job="t"')
    exact = promql.rate_le(names.TPOT, 0.1, sel, "5m")
    assert 'le="0.1"' in exact
    assert "*" not in exact
    between = promql.rate_le(names.TTFT, 2.0, sel, "5m")
    assert 'le=~"1(\\\\.0)?"' in between
    assert 'le="2.5"' in between
    assert "* 0.333333" in between
    assert "* 0.666667" in between
    below = promql.rate_le(names.TTFT, 0.0005, sel, "5m")
    assert 'le="0.001"' in below
    assert "* 0.5" in below


def test_slo_rules_follow_the_config():
    config = Config(
        ttft_target_s=2.5,
        answer_ttft_target_s=7.5,
        burn_windows=(BurnWindow("2h", "10m", 10, Severity.CRITICAL),),
    )
    records = [r["record"] for r in rules.slo_rules(config)]
    assert records == [
        rules.record_name(rules.TTFT_ERRORS, "10m"),
        rules.record_name(rules.TTFT_ERRORS, "2h"),
        rules.record_name(rules.TPOT_ERRORS, "10m"),
        rules.record_name(rules.TPOT_ERRORS, "2h"),
        rules.record_name(rules.ANSWER_TTFT_ERRORS, "10m"),
        rules.record_name(rules.ANSWER_TTFT_ERRORS, "2h"),
    ]
    assert 'le="2.5"' in rules.slo_rules(config)[0]["expr"]
    # The answer target is a bucket boundary: read exactly, never interpolated.
    answer = rules.slo_rules(config)[4]["expr"]
    assert f'{names.ANSWER_TTFT.prom_name}_bucket{{job="tokenstamp", le="7.5"}}' in answer
    assert "*" not in answer


def test_tenant_rules_read_only_labelled_series_and_follow_the_config():
    config = Config()
    records = rules.tenant_slo_rules(config)
    assert [r["record"] for r in records[: len(config.windows)]] == [
        rules.record_name(rules.TENANT_GOODPUT_ERRORS, w) for w in config.windows
    ]
    for rule in records:
        assert rule["expr"].count('tokenstamp_tenant!=""') == rule["expr"].count("{"), rule
        assert "by (job, server_address, tokenstamp_tenant)" in rule["expr"]
    assert {r["record"] for r in records} >= {
        rules.record_name(rules.TENANT_SLO_REQUESTS, w) for w in config.long_windows
    }
    # Without a minimum of streams there is no guard, and no request-rate rules to feed it.
    lax = replace(config, tenant_min_requests=0)
    assert all("requests_slo:rate" not in r["record"] for r in rules.tenant_slo_rules(lax))
    assert all(" >= " not in a["expr"] for a in alerts.tenant_alerts(lax))


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"ttft_objective": 1.0}, "ttft_objective"),
        ({"answer_ttft_objective": 0.0}, "answer_ttft_objective"),
        # Not a bucket boundary: the rules would interpolate, the alert judge an estimate.
        ({"answer_ttft_target_s": 3.0}, "answer_ttft_target_s"),
        ({"answer_ttft_target_s": 100.0}, "answer_ttft_target_s"),
        ({"answer_ttft_target_s": 1.0}, "answer_ttft_target_s"),  # below the TTFT target
        ({"tenant_goodput_objective": 0.0}, "tenant_goodput_objective"),
        ({"tenant_min_requests": -1}, "tenant_min_requests"),
        ({"tpot_target_s": 10.0}, "tpot_target_s"),
        ({"worst_gap_threshold_s": 0.0}, "worst_gap_threshold_s"),
        ({"selector": '{job="x"}'}, "selector"),
        ({"rule_window": "5 minutes"}, "rule_window"),
        ({"burn_windows": (BurnWindow("5m", "1h", 2, Severity.WARNING),)}, "burn_windows[0]"),
        ({"runbook_url": "https://x/runbook.md#a"}, "runbook_url"),
    ],
)
def test_config_rejects_bad_values_naming_the_key(change, key):
    with pytest.raises(ValueError, match=rf"^Config\.{re.escape(key)}: "):
        replace(Config(), **change)
