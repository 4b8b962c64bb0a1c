"""The one configuration the dashboards and rules are generated from.

Like a monitoring mixin's ``_config``: selectors, SLO targets and objectives,
burn-rate windows, stall thresholds and alert durations live here and nowhere
else. Validated on construction; a bad value raises ``ValueError`` naming the
field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from enum import StrEnum

from exporters import names


class Severity(StrEnum):
    """The ``severity`` label of an alert."""

    CRITICAL = "critical"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class BurnWindow:
    """One multi-window, multi-burn-rate condition (Google SRE workbook, "Alerting on SLOs")."""

    long: str
    """Long window (Prometheus duration): the burn must be sustained over it."""
    short: str
    """Short window, about 1/12 of the long one: the burn must still be going on."""
    factor: float
    """Burn rate: how many times faster than "exactly on budget" the errors come."""
    severity: Severity
    """Severity of the alert this condition belongs to."""


#: The SRE workbook's recommendation for a 30-day SLO period: page on 2 % of
#: the budget spent in 1 h or 5 % in 6 h, ticket on 10 % in 3 days.
DEFAULT_BURN_WINDOWS: tuple[BurnWindow, ...] = (
    BurnWindow("1h", "5m", 14.4, Severity.CRITICAL),
    BurnWindow("6h", "30m", 6.0, Severity.CRITICAL),
    BurnWindow("1d", "2h", 3.0, Severity.WARNING),
    BurnWindow("3d", "6h", 1.0, Severity.WARNING),
)

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_s(value: str) -> float:
    """Seconds of a Prometheus duration such as ``1h30m``; ``ValueError`` if malformed."""
    if not _DURATION.match(value):
        raise ValueError(f"not a Prometheus duration: {value!r}")
    return sum(int(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", value))


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the generated dashboards and rules depend on; defaults match the proxy's."""

    selector: str = 'job="tokenstamp"'
    """Label matchers (without braces) selecting the proxy's series and its ``up`` series."""
    ttft_target_s: float = 2.0
    """TTFT SLO target: a request meets it when its first token came within this (prefill)."""
    ttft_objective: float = 0.99
    """Share of requests that must meet the TTFT target over the SLO period."""
    tpot_target_s: float = 0.1
    """TPOT SLO target: a stream meets it when its time per output token is within this."""
    tpot_objective: float = 0.99
    """Share of streams that must meet the TPOT target over the SLO period."""
    answer_ttft_target_s: float = 5.0
    """Time-to-first-answer-token SLO target (the visible TTFT): a request meets it when its
    first answer event (content, text or a tool call, not reasoning) came within this. A
    bucket boundary of ``tokenstamp.time_to_first_answer_token``, so the error ratio is exact,
    and at least ``ttft_target_s``: the first answer never comes before the first token."""
    answer_ttft_objective: float = 0.99
    """Share of requests that must meet the time-to-first-answer-token target over the SLO
    period."""
    tenant_goodput_objective: float = 0.99
    """Share of each tenant's finished streams that must meet both targets (their own, sent in
    ``x-slo-ttft-ms`` / ``x-slo-tpot-ms``, or the proxy's ``--slo-ttft`` / ``--slo-tpot``)."""
    tenant_min_requests: int = 100
    """A tenant's burn alert needs at least this many finished streams in the long window (0:
    no minimum), so one miss among a handful of requests does not page."""
    slo_period: str = "30d"
    """SLO period the burn factors are meant for (used in texts only)."""
    burn_windows: tuple[BurnWindow, ...] = DEFAULT_BURN_WINDOWS
    """Multi-window, multi-burn-rate conditions; one alert per SLO and severity."""
    burn_for_critical: str = "2m"
    """``for`` of the critical (page) burn-rate alerts."""
    burn_for_warning: str = "15m"
    """``for`` of the warning (ticket) burn-rate alerts."""
    rule_window: str = "5m"
    """Rate window of the recording rules that the stall, error and decoder alerts read."""
    stutter_share_threshold: float = 0.05
    """Alert when prefills freeze more than this share of all stream time (user-s per stream-s)."""
    unattributed_share_threshold: float = 0.02
    """Alert when stalls without a prefill to blame freeze more than this share of stream time."""
    stall_alert_for: str = "15m"
    """``for`` of the stutter and unattributed-stall alerts."""
    worst_gap_threshold_s: float = 0.1
    """The dashboards count a stream as stalled when its worst inter-token gap exceeded this."""
    burst_window: str = "1m"
    """Window of the "stutter burst" annotation: shorter than ``rule_window`` to see bursts."""
    upstream_error_outcomes: tuple[str, ...] = ("upstream_error", "timeout")
    """``tokenstamp_outcome`` values that count as upstream errors."""
    upstream_error_ratio_threshold: float = 0.05
    """Alert when more than this share of a backend's requests end in an upstream error."""
    upstream_error_for: str = "10m"
    """``for`` of the upstream-error alert."""
    target_down_for: str = "5m"
    """``for`` of the target-down alert."""
    decoder_error_for: str = "15m"
    """``for`` of the decoder-error alert: any undecodable upstream event, sustained."""
    runbook_url: str = "dashboards/runbook.md"
    """Base of every ``runbook_url``; the alert's anchor is appended. Set it to a public URL."""
    dashboard_tags: tuple[str, ...] = ("tokenstamp",)
    """Tags of every dashboard; the dashboards link to each other through them."""
    dashboard_refresh: str = "30s"
    """Auto-refresh interval of the dashboards."""
    dashboard_time_from: str = "now-3h"
    """Default time range start of the dashboards."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_for") or f.name in ("slo_period", "rule_window", "burst_window"):
                _check(f.name, bool(_DURATION.match(value)), f"not a duration: {value!r}")
        _check("selector", "{" not in self.selector and "}" not in self.selector, "no braces")
        _check("selector", bool(self.selector.strip()), "must not be empty")
        for key in ("ttft_objective", "tpot_objective", "answer_ttft_objective",
                    "tenant_goodput_objective",
                    "stutter_share_threshold", "unattributed_share_threshold",
                    "upstream_error_ratio_threshold"):  # fmt: skip
            value = getattr(self, key)
            _check(key, 0.0 < value < 1.0, f"must be between 0 and 1, got {value}")
        for key, buckets in (
            ("ttft_target_s", names.TTFT.buckets),
            ("tpot_target_s", names.TPOT.buckets),
            ("worst_gap_threshold_s", names.MAX_GAP.buckets),
        ):
            value = getattr(self, key)
            _check(key, 0.0 < value <= buckets[-1], f"must be in (0, {buckets[-1]}], got {value}")
        # On a boundary, or the alert would judge by an interpolated share.
        bounds = " ".join(f"{b:g}" for b in names.ANSWER_TTFT.buckets)
        _check(
            "answer_ttft_target_s",
            self.answer_ttft_target_s in names.ANSWER_TTFT.buckets,
            f"must be a bucket boundary ({bounds}), got {self.answer_ttft_target_s}",
        )
        # The first answer event never comes before the first token.
        _check(
            "answer_ttft_target_s",
            self.answer_ttft_target_s >= self.ttft_target_s,
            f"must be >= ttft_target_s ({self.ttft_target_s}), got {self.answer_ttft_target_s}",
        )
        _check("tenant_min_requests", self.tenant_min_requests >= 0, "must be >= 0")
        _check("burn_windows", bool(self.burn_windows), "needs at least one window")
        for i, w in enumerate(self.burn_windows):
            key = f"burn_windows[{i}]"
            _check(key, bool(_DURATION.match(w.long) and _DURATION.match(w.short)), "durations")
            _check(key, duration_s(w.short) < duration_s(w.long), "short must be < long")
            _check(key, w.factor > 0, "factor must be > 0")
        _check("upstream_error_outcomes", bool(self.upstream_error_outcomes), "empty")
        _check("runbook_url", "#" not in self.runbook_url, "no anchor: it is appended")

    @property
    def long_windows(self) -> tuple[str, ...]:
        """Every distinct long burn-rate window, shortest first."""
        return tuple(w for w in self.windows if w in {b.long for b in self.burn_windows})

    @property
    def windows(self) -> tuple[str, ...]:
        """Every distinct burn-rate window, shortest first."""
        distinct = {w for b in self.burn_windows for w in (b.long, b.short)}
        return tuple(sorted(distinct, key=lambda w: (duration_s(w), w)))

    def burn_for(self, severity: Severity) -> str:
        """``for`` duration of a burn-rate alert of this severity."""
        return self.burn_for_critical if severity is Severity.CRITICAL else self.burn_for_warning


def _check(key: str, ok: bool, why: str) -> None:
    if not ok:
        raise ValueError(f"Config.{key}: {why}")
