"""Prometheus alerting rules.

Every alert has a ``severity`` label and ``summary``, ``description`` and
``runbook_url`` annotations; the runbook has one section per alert name
(``dashboards/runbook.md``). The SLO alerts are multi-window, multi-burn-rate
alerts as in the Google SRE workbook's "Alerting on SLOs".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dashboards import promql, rules
from dashboards.config import BurnWindow, Config, Severity, duration_s

Alert = dict[str, Any]

TTFT_BURN = "TokenstampTTFTBudgetBurn"
TPOT_BURN = "TokenstampTPOTBudgetBurn"
ANSWER_TTFT_BURN = "TokenstampAnswerTTFTBudgetBurn"
TENANT_GOODPUT_BURN = "TokenstampTenantGoodputBudgetBurn"
PREFILL_STUTTER = "TokenstampPrefillStutter"
UNATTRIBUTED_STALLS = "TokenstampUnattributedStalls"
UPSTREAM_ERRORS = "TokenstampUpstreamErrors"
TARGET_DOWN = "TokenstampTargetDown"
DECODER_ERRORS = "TokenstampDecoderErrors"

#: Every alert name, in runbook order.
ALERT_NAMES: tuple[str, ...] = (
    TTFT_BURN,
    TPOT_BURN,
    ANSWER_TTFT_BURN,
    TENANT_GOODPUT_BURN,
    PREFILL_STUTTER,
    UNATTRIBUTED_STALLS,
    UPSTREAM_ERRORS,
    TARGET_DOWN,
    DECODER_ERRORS,
)


def runbook_url(config: Config, alert: str) -> str:
    """The runbook section of an alert: GitHub's anchor of its ``## Name`` heading."""
    return f"{config.runbook_url}#{alert.lower()}"


def _pct(x: float) -> str:
    return f"{x * 100:g}%"


def _alert(
    config: Config,
    name: str,
    expr: str,
    for_: str,
    severity: Severity,
    summary: str,
    description: str,
) -> Alert:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": str(severity)},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": runbook_url(config, name),
        },
    }


def _burn_conditions(
    config: Config,
    severity: Severity,
    template: str,
    objective: float,
    also: Callable[[BurnWindow], str] | None = None,
) -> tuple[str, str] | None:
    """The multi-window expression of one severity and its wording; ``None`` without windows.

    Each condition: the error ratio over the long and the short window both
    above ``factor`` times the budget, and ``also(window)`` when given.
    """
    budget = promql.num(1 - objective)
    windows = [w for w in config.burn_windows if w.severity is severity]
    if not windows:
        return None
    clauses = []
    for w in windows:
        long = rules.record_name(template, w.long)
        short = rules.record_name(template, w.short)
        threshold = f"({promql.num(w.factor)} * {budget})"
        extra = f"\nand\n  {also(w)}" if also else ""
        clauses.append(f"(\n  {long} > {threshold}\nand\n  {short} > {threshold}{extra}\n)")
    conditions = ", or ".join(
        f"{promql.num(w.factor)}x over {w.long} and {w.short}" for w in windows
    )
    return "\nor\n".join(clauses), conditions


def _burn_alerts(
    config: Config,
    name: str,
    template: str,
    what: str,
    counted: str,
    target_s: float,
    objective: float,
    note: str = "",
) -> list[Alert]:
    """Critical and warning burn alerts of one SLO; ``note`` ends the description."""
    out: list[Alert] = []
    for severity in (Severity.CRITICAL, Severity.WARNING):
        burn = _burn_conditions(config, severity, template, objective)
        if burn is None:
            continue
        expr, conditions = burn
        out.append(
            _alert(
                config,
                name,
                expr,
                config.burn_for(severity),
                severity,
                f"{{{{ $labels.server_address }}}} is burning its {what} error budget"
                + (" fast." if severity is Severity.CRITICAL else "."),
                f"{{{{ $value | humanizePercentage }}}} of {counted} on "
                f"{{{{ $labels.server_address }}}} missed the {what} target of "
                f"{promql.num(target_s)}s (objective {_pct(objective)} over "
                f"{config.slo_period}). Budget burn rate above {conditions}." + note,
            )
        )
    return out


def tenant_alerts(config: Config) -> list[Alert]:
    """Per tenant and backend: goodput error-budget burn (both targets, each stream's own).

    Reads only the per-tenant rules, which record nothing without tenant labels:
    then this alert cannot fire, and the TTFT and TPOT alerts cover the backend.
    """
    n = config.tenant_min_requests

    def enough(w: BurnWindow) -> str:
        rate = rules.record_name(rules.TENANT_SLO_REQUESTS, w.long)
        return f"{rate} * {promql.num(duration_s(w.long))} >= {n}"

    tenant = "{{ $labels.tokenstamp_tenant }}"
    on = "{{ $labels.server_address }}"
    out: list[Alert] = []
    for severity in (Severity.CRITICAL, Severity.WARNING):
        burn = _burn_conditions(
            config, severity, rules.TENANT_GOODPUT_ERRORS, config.tenant_goodput_objective,
            enough if n else None,
        )  # fmt: skip
        if burn is None:
            continue
        expr, conditions = burn
        minimum = f", with at least {n} streams of the tenant in the long window" if n else ""
        out.append(
            _alert(
                config,
                TENANT_GOODPUT_BURN,
                expr,
                config.burn_for(severity),
                severity,
                f"Tenant {tenant} is burning its goodput error budget on {on}"
                + (" fast." if severity is Severity.CRITICAL else "."),
                f"{{{{ $value | humanizePercentage }}}} of tenant {tenant}'s streams on {on} "
                "missed their TTFT or TPOT target (the request's own, else the defaults of "
                f"{promql.num(config.ttft_target_s)}s and {promql.num(config.tpot_target_s)}s; "
                f"objective {_pct(config.tenant_goodput_objective)} over {config.slo_period}). "
                f"Budget burn rate above {conditions}{minimum}.",
            )
        )
    return out


def slo_alerts(config: Config) -> list[Alert]:
    """TTFT (prefill), TPOT (decode) and time-to-first-answer-token error-budget burn alerts.

    The answer alert reads the time to the first answer event, which with a reasoning
    model is TTFT plus the thinking: the wait a user feels. Without reasoning it equals
    TTFT, and with the default targets it fires only when the TTFT alert fires too.
    """
    return [
        *_burn_alerts(
            config, TTFT_BURN, rules.TTFT_ERRORS, "TTFT", "requests", config.ttft_target_s,
            config.ttft_objective,
        ),
        *_burn_alerts(
            config, TPOT_BURN, rules.TPOT_ERRORS, "TPOT", "streams", config.tpot_target_s,
            config.tpot_objective,
        ),
        *_burn_alerts(
            config, ANSWER_TTFT_BURN, rules.ANSWER_TTFT_ERRORS, "time-to-first-answer-token",
            "requests", config.answer_ttft_target_s, config.answer_ttft_objective,
            " The first answer event is content, text or a tool call; reasoning before it "
            "counts as waiting.",
        ),
    ]  # fmt: skip


def backend_alerts(config: Config) -> list[Alert]:
    """Stutter, unattributed stalls, upstream errors, target down, decoder errors."""
    w = config.rule_window
    outcomes = " or ".join(config.upstream_error_outcomes)
    on = "{{ $labels.server_address }} (instance {{ $labels.instance }})"
    return [
        _alert(
            config,
            PREFILL_STUTTER,
            f"{rules.record_name(rules.STUTTER_SHARE, w)} > "
            f"{promql.num(config.stutter_share_threshold)}",
            config.stall_alert_for,
            Severity.WARNING,
            "Prefills freeze the other streams on {{ $labels.server_address }}.",
            f"Prefills of new requests froze {{{{ $value | humanizePercentage }}}} of all stream "
            f"time on {on} over {w} (threshold {_pct(config.stutter_share_threshold)}). "
            "Long prompts are prefilled in one piece while every other stream waits: enable "
            "chunked prefill, or make the chunk smaller.",
        ),
        _alert(
            config,
            UNATTRIBUTED_STALLS,
            f"{rules.record_name(rules.UNATTRIBUTED_SHARE, w)} > "
            f"{promql.num(config.unattributed_share_threshold)}",
            config.stall_alert_for,
            Severity.WARNING,
            "{{ $labels.server_address }} stalls its streams with no prefill to blame.",
            "Stalls that no overlapping prefill explains froze "
            f"{{{{ $value | humanizePercentage }}}} of stream time on {on} over {w} (threshold "
            f"{_pct(config.unattributed_share_threshold)}). The backend itself hiccups.",
        ),
        _alert(
            config,
            UPSTREAM_ERRORS,
            f"{rules.record_name(rules.UPSTREAM_ERRORS, w)} > "
            f"{promql.num(config.upstream_error_ratio_threshold)}",
            config.upstream_error_for,
            Severity.WARNING,
            "Requests to {{ $labels.server_address }} fail upstream.",
            f"{{{{ $value | humanizePercentage }}}} of requests to {on} ended in {outcomes} "
            f"over {w} (threshold {_pct(config.upstream_error_ratio_threshold)}).",
        ),
        _alert(
            config,
            TARGET_DOWN,
            f"up{rules.sel(config)} == 0",
            config.target_down_for,
            Severity.CRITICAL,
            "Prometheus cannot scrape tokenstamp at {{ $labels.instance }}.",
            f"{{{{ $labels.job }}}}/{{{{ $labels.instance }}}} has been down for "
            f"{config.target_down_for}: no latency, stall or SLO data comes from it, so the "
            "other tokenstamp alerts cannot fire for its backends.",
        ),
        _alert(
            config,
            DECODER_ERRORS,
            f"{rules.record_name(rules.DECODER_ERRORS, w)} > 0",
            config.decoder_error_for,
            Severity.WARNING,
            "tokenstamp cannot decode some stream events from {{ $labels.server_address }}.",
            f'{{{{ printf "%.3g" $value }}}} undecodable events per second from {on}, for '
            f"{config.decoder_error_for}. The bytes still reach the clients, but those events "
            "are not timed: TTFT, gaps and stalls are incomplete.",
        ),
    ]


def alert_groups(config: Config) -> list[dict[str, Any]]:
    """The rule groups of the alerts file."""
    return [
        {"name": "tokenstamp.slo.alerts", "rules": slo_alerts(config)},
        {"name": "tokenstamp.tenant.slo.alerts", "rules": tenant_alerts(config)},
        {"name": "tokenstamp.alerts", "rules": backend_alerts(config)},
    ]
