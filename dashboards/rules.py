"""Prometheus recording rules: what the dashboards and the alerts share.

Names follow ``level:metric:operations``. Three levels:

- ``instance_server_address``: per proxy instance and backend (``job`` kept),
  for what happens on one machine: stalls, stutter, errors, decoder errors;
- ``server_address``: per backend across proxy replicas (``job`` kept), for
  the SLOs, which belong to the service, not to one replica;
- ``server_address_tokenstamp_tenant``: per backend and tenant across replicas,
  for each tenant's goodput SLO. Only series that carry a tenant (the proxy runs
  with ``--tenant-header``) are read, so without tenants these rules record
  nothing and the overall SLO rules are the only ones.
"""

from __future__ import annotations

from typing import Any

from dashboards import promql
from dashboards.config import Config
from exporters import names

#: Labels kept by the per-instance rules.
INSTANCE_LEVEL: tuple[str, ...] = ("job", "instance", "server_address")
#: Labels kept by the SLO rules.
SLO_LEVEL: tuple[str, ...] = ("job", "server_address")
#: Labels kept by the per-tenant SLO rules.
TENANT_LEVEL: tuple[str, ...] = (*SLO_LEVEL, names.label_name(names.TENANT))

STALL_CAUSE = names.label_name(names.STALL_CAUSE)
OUTCOME = names.label_name(names.OUTCOME)
SLO = names.label_name(names.SLO)
TENANT = names.label_name(names.TENANT)

STREAMS_AVG = "instance_server_address:tokenstamp_streams_active:avg_over_time{w}"
STUTTER_RATE = "instance_server_address:tokenstamp_prefill_stutter_cost_seconds:rate{w}"
STUTTER_SHARE = "instance_server_address:tokenstamp_prefill_stutter_cost_per_stream:ratio_rate{w}"
UNATTRIBUTED_RATE = "instance_server_address:tokenstamp_unattributed_stall_seconds:rate{w}"
UNATTRIBUTED_SHARE = (
    "instance_server_address:tokenstamp_unattributed_stall_seconds_per_stream:ratio_rate{w}"
)
UPSTREAM_ERRORS = "instance_server_address:tokenstamp_requests_upstream_errors:ratio_rate{w}"
DECODER_ERRORS = "instance_server_address:tokenstamp_decoder_errors:rate{w}"
TTFT_ERRORS = "server_address:tokenstamp_ttft_slo_errors_per_request:ratio_rate{w}"
TPOT_ERRORS = "server_address:tokenstamp_tpot_slo_errors_per_request:ratio_rate{w}"
ANSWER_TTFT_ERRORS = "server_address:tokenstamp_answer_ttft_slo_errors_per_request:ratio_rate{w}"
TENANT_GOODPUT_ERRORS = (
    "server_address_tokenstamp_tenant:tokenstamp_goodput_slo_errors_per_request:ratio_rate{w}"
)
TENANT_SLO_REQUESTS = "server_address_tokenstamp_tenant:tokenstamp_requests_slo:rate{w}"

Rule = dict[str, Any]
Group = dict[str, Any]


def record_name(template: str, window: str) -> str:
    """A recording rule's name for one rate window."""
    return template.format(w=window)


def sel(config: Config, *extra: str) -> str:
    """The proxy's selector plus extra matchers, in braces."""
    return promql.matchers(config.selector, *extra)


def _rule(name: str, expr: str) -> Rule:
    return {"record": name, "expr": expr}


def backend_rules(config: Config) -> list[Rule]:
    """Per instance and backend: stutter and stall shares, upstream errors, decoder errors."""
    w = config.rule_window
    s = sel(config)
    by = INSTANCE_LEVEL
    streams = record_name(STREAMS_AVG, w)
    stutter = record_name(STUTTER_RATE, w)
    unattributed = record_name(UNATTRIBUTED_RATE, w)
    # A stream-second frozen per stream-second: the share of all output time lost.
    # clamp_min: short streams between scrapes can leave the gauge at 0.
    per_stream = f"\n/\nclamp_min({streams}, 1)"
    unattr_sel = sel(config, f'{STALL_CAUSE}="unattributed"')
    outcomes = "|".join(config.upstream_error_outcomes)
    err_sel = sel(config, f'{OUTCOME}=~"{outcomes}"')
    return [
        _rule(
            streams,
            f"sum{promql.by(by)} (avg_over_time({names.STREAMS_ACTIVE.prom_series}{s}[{w}]))",
        ),
        _rule(stutter, promql.counter_rate(names.STUTTER_COST, s, w, by)),
        _rule(record_name(STUTTER_SHARE, w), stutter + per_stream),
        _rule(unattributed, promql.sum_of_rate(names.STALL_DURATION, unattr_sel, w, by)),
        _rule(record_name(UNATTRIBUTED_SHARE, w), unattributed + per_stream),
        _rule(
            record_name(UPSTREAM_ERRORS, w),
            promql.counter_rate(names.REQUESTS, err_sel, w, by)
            + "\n/\n"
            + promql.counter_rate(names.REQUESTS, s, w, by),
        ),
        _rule(record_name(DECODER_ERRORS, w), promql.counter_rate(names.DECODER_ERRORS, s, w, by)),
    ]


def slo_rules(config: Config) -> list[Rule]:
    """Per backend and burn-rate window: share of requests that missed each SLO target.

    TTFT (the first output event of either kind), TPOT, and the time to first answer
    token (the first answer event: with a reasoning model, TTFT plus the thinking; without
    reasoning its histogram equals TTFT's).
    """
    s = sel(config)
    out: list[Rule] = []
    for template, inst, target in (
        (TTFT_ERRORS, names.TTFT, config.ttft_target_s),
        (TPOT_ERRORS, names.TPOT, config.tpot_target_s),
        (ANSWER_TTFT_ERRORS, names.ANSWER_TTFT, config.answer_ttft_target_s),
    ):
        for w in config.windows:
            expr = promql.share_above(inst, target, s, w, SLO_LEVEL)
            out.append(_rule(record_name(template, w), expr))
    return out


def tenant_slo_rules(config: Config) -> list[Rule]:
    """Per backend and tenant: share of finished streams that missed their targets, per window.

    The goodput counter judges each stream by its own targets when the request
    sent them, else by the proxy's defaults. ``tokenstamp_tenant!=""`` keeps out
    series without a tenant: those are the whole backend, which the TTFT and
    TPOT rules already cover. The request rate over each long window lets the
    alert ignore tenants with too few streams to judge.
    """
    tenanted = f'{TENANT}!=""'
    s = sel(config, tenanted)
    missed = sel(config, tenanted, f'{SLO}="missed"')
    slo = names.SLO_REQUESTS
    out = [
        _rule(
            record_name(TENANT_GOODPUT_ERRORS, w),
            promql.ratio(
                promql.counter_rate(slo, missed, w, TENANT_LEVEL),
                promql.counter_rate(slo, s, w, TENANT_LEVEL),
            ),
        )
        for w in config.windows
    ]
    if config.tenant_min_requests:
        out += [
            _rule(record_name(TENANT_SLO_REQUESTS, w), promql.counter_rate(slo, s, w, TENANT_LEVEL))
            for w in config.long_windows
        ]
    return out


def recording_groups(config: Config) -> list[Group]:
    """The rule groups of the recording-rules file."""
    return [
        {"name": "tokenstamp.backend.rules", "rules": backend_rules(config)},
        {"name": "tokenstamp.slo.rules", "rules": slo_rules(config)},
        {"name": "tokenstamp.tenant.slo.rules", "rules": tenant_slo_rules(config)},
    ]
