"""The tenant panels count right with tenants, and show one named line without them.

Runs the committed panels' queries, Grafana's variables filled in as a
dashboard would send them, as ``promtool test rules`` expression tests over
synthetic series: once with the labels ``--tenant-header`` adds, once with
none (the default).
"""

from __future__ import annotations

import pytest

from dashboards.promql import NO_TENANT
from tests.dashboards.panel_queries import LATENCY, STUTTER, panel_expr, run_promtool

REQUEST = 'job="tokenstamp", instance="p0:9464", gen_ai_operation_name="chat", ' \
    'gen_ai_provider_name="vllm", gen_ai_request_model="m", server_address="vllm-a"'  # fmt: skip
BACKEND = 'job="tokenstamp", instance="p0:9464", gen_ai_provider_name="vllm", ' \
    'server_address="vllm-a"'  # fmt: skip

#: (series, per-minute increase) with the tenant labels; one hour of samples.
TENANT_SERIES = [
    (f'tokenstamp_stalls_total{{{BACKEND}, tokenstamp_stall_cause="prefill", '
     'tokenstamp_tenant="globex", tokenstamp_culprit_tenant="acme"}', 2),
    (f'tokenstamp_stalls_total{{{BACKEND}, tokenstamp_stall_cause="prefill", '
     'tokenstamp_tenant="acme", tokenstamp_culprit_tenant="globex"}', 0.5),
    (f'tokenstamp_stalls_total{{{BACKEND}, tokenstamp_stall_cause="unattributed", '
     'tokenstamp_tenant="acme", tokenstamp_culprit_tenant="none"}', 1),
    (f'tokenstamp_stalls_total{{{BACKEND}, tokenstamp_stall_cause="prefill", '
     'tokenstamp_tenant="initech", tokenstamp_culprit_tenant="initech"}', 0.1),
    (f'tokenstamp_prefill_stutter_cost_seconds_total{{{REQUEST}, tokenstamp_tenant="acme"}}', 30),
    (f'tokenstamp_prefill_stutter_cost_seconds_total{{{REQUEST}, tokenstamp_tenant="globex"}}', 6),
    (f'tokenstamp_requests_slo_total{{{REQUEST}, tokenstamp_tenant="acme", tokenstamp_slo="met", '
     'tokenstamp_slo_source="request"}', 90),
    (f'tokenstamp_requests_slo_total{{{REQUEST}, tokenstamp_tenant="acme", '
     'tokenstamp_slo="missed", tokenstamp_slo_source="request"}', 10),
    (f'tokenstamp_requests_slo_total{{{REQUEST}, tokenstamp_tenant="globex", '
     'tokenstamp_slo="met", tokenstamp_slo_source="default"}', 50),
    # Every stream of initech missed: it has no "met" series at all.
    (f'tokenstamp_requests_slo_total{{{REQUEST}, tokenstamp_tenant="initech", '
     'tokenstamp_slo="missed", tokenstamp_slo_source="default"}', 5),
    (f'tokenstamp_requests_total{{{REQUEST}, tokenstamp_tenant="other", '
     'tokenstamp_outcome="ok", http_response_status_code="2xx"}', 1),
    (f'tokenstamp_requests_total{{{REQUEST}, tokenstamp_tenant="acme", '
     'tokenstamp_outcome="ok", http_response_status_code="2xx"}', 3),
]  # fmt: skip

#: The same traffic from a proxy without --tenant-header.
PLAIN_SERIES = [
    (f'tokenstamp_stalls_total{{{BACKEND}, tokenstamp_stall_cause="prefill"}}', 3),
    (f'tokenstamp_stalls_total{{{BACKEND}, tokenstamp_stall_cause="unattributed"}}', 1),
    (f"tokenstamp_prefill_stutter_cost_seconds_total{{{REQUEST}}}", 30),
    (f'tokenstamp_requests_slo_total{{{REQUEST}, tokenstamp_slo="met", '
     'tokenstamp_slo_source="default"}', 90),
    (f'tokenstamp_requests_slo_total{{{REQUEST}, tokenstamp_slo="missed", '
     'tokenstamp_slo_source="default"}', 10),
    (f'tokenstamp_requests_total{{{REQUEST}, tokenstamp_outcome="ok", '
     'http_response_status_code="2xx"}', 4),
]  # fmt: skip


def _labels(**labels: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _pair(culprit: str, stalled: str) -> str:
    return _labels(tokenstamp_culprit_tenant=culprit, tokenstamp_tenant=stalled)


def _tenant(name: str) -> str:
    return _labels(tokenstamp_tenant=name)


#: (dashboard, panel, query index, $tenant, series) -> expected {labels: value}.
CASES: list[tuple[str, str, int, str, list[tuple[str, float]], dict[str, float]]] = [
    # Who stalls whom over the hour: every pair; "none" is an unattributed stall.
    (STUTTER, "Who stalls whom", 0, ".*", TENANT_SERIES, {
        _pair("acme", "globex"): 120, _pair("globex", "acme"): 30,
        _pair("none", "acme"): 60, _pair("initech", "initech"): 6}),
    # Tenant acme chosen: the stalls it suffered and the stalls it caused.
    (STUTTER, "Who stalls whom", 0, "acme", TENANT_SERIES, {
        _pair("acme", "globex"): 120, _pair("globex", "acme"): 30, _pair("none", "acme"): 60}),
    (STUTTER, "Who stalls whom", 0, ".*", PLAIN_SERIES, {_pair(NO_TENANT, NO_TENANT): 240}),
    # The stutter cost carries the culprit's labels: whose prefills froze the others.
    (STUTTER, "Stutter cost by culprit tenant", 0, ".*", TENANT_SERIES, {
        _tenant("acme"): 0.5, _tenant("globex"): 0.1}),
    (STUTTER, "Stutter cost by culprit tenant", 0, "acme", TENANT_SERIES, {_tenant("acme"): 0.5}),
    (STUTTER, "Stutter cost by culprit tenant", 0, ".*", PLAIN_SERIES, {_tenant(NO_TENANT): 0.5}),
    # A goodput of 0 is a line at 0, not a missing one.
    (LATENCY, "Goodput by tenant", 0, ".*", TENANT_SERIES, {
        _tenant("acme"): 0.9, _tenant("globex"): 1, _tenant("initech"): 0}),
    (LATENCY, "Goodput by tenant", 0, "globex", TENANT_SERIES, {_tenant("globex"): 1}),
    (LATENCY, "Goodput by tenant", 0, ".*", PLAIN_SERIES, {_tenant(NO_TENANT): 0.9}),
    # If Grafana sent an empty value for a variable without options, it still matches.
    (LATENCY, "Goodput by tenant", 0, "", PLAIN_SERIES, {_tenant(NO_TENANT): 0.9}),
    (LATENCY, "Goodput by SLO source", 0, ".*", TENANT_SERIES, {
        _labels(tokenstamp_slo_source="request"): 0.9,
        _labels(tokenstamp_slo_source="default"): 0.909}),
    (LATENCY, "Goodput by SLO source", 1, ".*", TENANT_SERIES, {"{}": 0.645}),
    (LATENCY, "Goodput by SLO source", 0, ".*", PLAIN_SERIES, {
        _labels(tokenstamp_slo_source="default"): 0.9}),
    (LATENCY, "Requests folded into other", 0, ".*", TENANT_SERIES, {
        _labels(server_address="vllm-a"): 0.25}),
    (LATENCY, "Requests folded into other", 0, ".*", PLAIN_SERIES, {
        _labels(server_address="vllm-a"): 0}),
]  # fmt: skip


@pytest.mark.parametrize("series", [TENANT_SERIES, PLAIN_SERIES], ids=["tenants", "no-tenants"])
def test_tenant_panels_on_synthetic_series(promtool, tmp_path, series):
    tests = [
        {
            "expr": f"round(\n{panel_expr(dash, title, index, tenant)}\n, 0.001)",
            "eval_time": "60m",
            "exp_samples": [{"labels": k, "value": v} for k, v in expected.items()],
        }
        for dash, title, index, tenant, data, expected in CASES
        if data is series
    ]
    assert len(tests) >= 6
    result = run_promtool(promtool, tmp_path, series, tests)
    assert result.returncode == 0, result.stdout + result.stderr
