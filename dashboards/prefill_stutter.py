"""The "Prefill stutter" dashboard: how much one request's prefill freezes the others.

Stalls by cause, their durations, the user-seconds of frozen output prefills
cost, how many streams one prefill stalls, the share of streams that stalled,
and TTFT next to the stall rate: the trade the prefill chunk size controls;
with tenants, who stalls whom. Thresholds are the alerts'; annotations mark
minutes where stutter bursts.

The tenant variable filters the stalled streams' tenant on stall panels, and
the culprit's tenant on what prefills cost (stutter cost, streams stalled per
prefill: those series carry the prefilling request's labels). Backend-wide
numbers (stall durations, recorded shares, the advisor) are not filtered.
"""

from __future__ import annotations

from dashboards import promql, rules
from dashboards.config import Config
from dashboards.grafana import (
    Json,
    Layout,
    Phase,
    Query,
    buckets,
    dashboard,
    heatmap,
    legend,
    line_at,
    percentiles,
    prometheus_annotation,
    request_label_variable,
    right_axis,
    stat,
    table,
    tenant_variable,
    thresholds,
    timeseries,
)
from dashboards.promql import TENANT, TENANT_MATCHER, by_tenant
from exporters import names

UID = "tokenstamp-prefill-stutter"
BACKEND = names.label_name(names.SERVER_ADDRESS)
CAUSE = names.label_name(names.STALL_CAUSE)
CULPRIT = names.label_name(names.CULPRIT_TENANT)
RI = promql.RATE_INTERVAL


def _burst_expr(config: Config) -> str:
    """Minutes where prefills froze more of the stream time than the alert allows."""
    s = rules.sel(config, f'{BACKEND}=~"$backend"')
    cost = promql.counter_rate(names.STUTTER_COST, s, config.burst_window, (BACKEND,))
    streams = f"sum by ({BACKEND}) ({names.STREAMS_ACTIVE.prom_series}{s})"
    return f"{cost}\n/\nclamp_min({streams}, 1)\n> {promql.num(config.stutter_share_threshold)}"


def _fitted(inst: names.Instrument, sel: str) -> str:
    """One advisor gauge per backend (every proxy instance fits the same backend: the max)."""
    return f"max by ({BACKEND}) ({inst.prom_name}{sel})"


def _trade_on_this_backend(lay: Layout, s: str) -> None:
    """The advisor's fitted cost model: what a step costs here, and what a chunk adds to it."""
    base = _fitted(names.DECODE_STEP_BASE, s)
    per_stream = _fitted(names.DECODE_STEP_PER_STREAM, s)
    chunk = _fitted(names.PREFILL_CHUNK, s)
    rate = _fitted(names.PREFILL_RATE, s)
    streams = f"sum by ({BACKEND}) ({names.STREAMS_ACTIVE.prom_series}{s})"
    step_now = f"{base} + {per_stream} * {streams}"
    lay.row("The trade on this backend")
    lay.add(stat("Chunk size in use", "Prompt tokens per step the advisor finds in use (0: "
                 "prompts are not chunked); `tokenstamp advise` prints what every other size "
                 "would do.", Phase.STUTTER, Query(chunk, legend(BACKEND)), "short"),
            4)  # fmt: skip
    lay.add(timeseries("Fitted prefill throughput", "Uncached prompt tokens per second the "
                       "backend prefills, fitted from the stalls and first tokens the proxy "
                       "saw.", Phase.PREFILL, [Query(rate, legend(BACKEND))], "short"),
            6)  # fmt: skip
    lay.add(timeseries("Fitted decode step", "The decode step: its base (left) and its extra "
                       "cost per decoding stream (right), fitted from gaps at each number of "
                       "streams.", Phase.DECODE,
                       [Query(base, f"base {legend(BACKEND)}"),
                        Query(per_stream, f"per stream {legend(BACKEND)}")],
                       "s", overrides=[right_axis("B", "s")]), 7)  # fmt: skip
    lay.add(timeseries("Step now, and with one chunk of prefill", "The decode step at the "
                       "streams open now, and the same step carrying one prefill chunk: the "
                       "worst gap a long prompt causes at the chunk size in use (the same "
                       "line when unchunked: then the whole prompt is one step).",
                       Phase.STUTTER,
                       [Query(step_now, f"decode step {legend(BACKEND)}"),
                        Query(f"{step_now} + {chunk} / {rate}",
                              f"step with a chunk {legend(BACKEND)}")], "s"), 7)  # fmt: skip


def _who_stalls_whom(lay: Layout, config: Config) -> None:
    """Stalls by culprit and stalled tenant, and what each tenant's prefills cost the others."""
    backend = f'{BACKEND}=~"$backend"'
    # TENANT_MATCHER picks the stalled stream's tenant on the stall counter, and the
    # prefilling request's on the stutter cost (it carries the culprit's labels).
    chosen = rules.sel(config, backend, TENANT_MATCHER)
    culprit = rules.sel(config, backend, f'{CULPRIT}=~"$tenant"')
    pair = (CULPRIT, TENANT)

    def stalls(sel: str) -> str:
        return f"sum{promql.by(pair)} (increase({names.STALLS.prom_series}{sel}[$__range]))"

    # Rows where the chosen tenants are stalled, or stall others: "or" keeps one of
    # each pair of labels, so "All" (or no tenants at all) counts every stall once.
    both = f"{stalls(chosen)}\nor\n{stalls(culprit)}"
    lay.row("Tenants: who stalls whom")
    lay.add(table("Who stalls whom", "Stalls in the time range by the tenant whose prefill "
                  "caused them (the first culprit; none: unattributed) and the tenant whose "
                  "stream froze, for rows where the chosen tenants are either.", Phase.STUTTER,
                  Query(by_tenant(by_tenant(both, CULPRIT)), instant=True, table=True),
                  "short", {CULPRIT: "culprit tenant (prefill)", TENANT: "stalled tenant"},
                  "stalls"), 12, 9)  # fmt: skip
    cost = promql.counter_rate(names.STUTTER_COST, chosen, RI, (TENANT,))
    lay.add(timeseries("Stutter cost by culprit tenant", "User-seconds of other streams' output "
                       "frozen per second by each tenant's prefills (the tenant filter picks "
                       "culprits here): whose long prompts the others pay for.", Phase.STUTTER,
                       [Query(by_tenant(cost), legend(TENANT))], "short", stack=True),
            12, 9)  # fmt: skip


def build(config: Config) -> Json:
    """The dashboard JSON model."""
    has_backend = f'{BACKEND}=~"$backend"'
    s = rules.sel(config, has_backend)
    st = rules.sel(config, has_backend, TENANT_MATCHER)
    prefill = rules.sel(config, has_backend, TENANT_MATCHER, f'{CAUSE}="prefill"')
    unattributed = rules.sel(config, has_backend, TENANT_MATCHER, f'{CAUSE}="unattributed"')
    recorded = promql.matchers(has_backend)
    w = config.rule_window
    gap_s = promql.num(config.worst_gap_threshold_s)
    stutter_share = f"{rules.record_name(rules.STUTTER_SHARE, w)}{recorded}"
    unattributed_share = f"{rules.record_name(rules.UNATTRIBUTED_SHARE, w)}{recorded}"
    stalled = names.STALLED_STREAMS
    stutter_line = line_at(config.stutter_share_threshold)
    unattributed_line = line_at(config.unattributed_share_threshold)

    lay = Layout()
    lay.row("Now")
    lay.add(stat("Frozen by prefills, worst backend", f"Largest share, over instances and "
                 f"backends, of stream time frozen by other requests' prefills ({w}, all "
                 "tenants); the alert threshold turns it red.", Phase.STUTTER,
                 Query(f"max({stutter_share})"),
                 "percentunit", thresholds(("green", None),
                                           ("red", config.stutter_share_threshold))),
            6, 5)  # fmt: skip
    lay.add(stat("Prefill stalls per second", "Stalls per second of the chosen tenants' streams "
                 "that an overlapping prefill explains.", Phase.STUTTER,
                 Query(promql.counter_rate(names.STALLS, prefill, RI)), "short"), 6, 5)  # fmt: skip
    lay.add(stat("Unattributed stalls per second", "Stalls per second of the chosen tenants' "
                 "streams with no prefill to blame: the backend itself hiccuped.", Phase.DECODE,
                 Query(promql.counter_rate(names.STALLS, unattributed, RI)), "short"),
            6, 5)  # fmt: skip
    lay.add(stat(f"Streams with a gap over {gap_s}s", f"Share of finished streams whose worst "
                 f"inter-token gap exceeded {gap_s}s.", Phase.DECODE,
                 Query(promql.share_above(names.MAX_GAP, config.worst_gap_threshold_s, st, RI)),
                 "percentunit"), 6, 5)  # fmt: skip

    lay.row("Stalls")
    lay.add(timeseries("Stalls per second by cause", "Gaps far above their stream's baseline, "
                       "per second: prefill when a culprit's prefill overlapped, else "
                       "unattributed.", Phase.STUTTER,
                       [Query(promql.counter_rate(names.STALLS, st, RI, (BACKEND, CAUSE)),
                              legend(CAUSE, BACKEND))], "short"), 12)  # fmt: skip
    lay.add(heatmap("Stall durations", "Stalls per duration bucket over time, both causes: how "
                    "long output froze each time (all tenants).", Phase.STUTTER,
                    buckets(names.STALL_DURATION, s, RI), "s"), 12)  # fmt: skip
    lay.add(timeseries("Stall duration p50 / p99 by cause", "Median and p99 length of one stall, "
                       "by cause (all tenants).", Phase.STUTTER,
                       percentiles(names.STALL_DURATION, s, RI, CAUSE, (0.5, 0.99)),
                       "s", threshold=line_at(config.worst_gap_threshold_s, "orange")),
            12)  # fmt: skip
    lay.add(timeseries("Share of streams that stalled", f"Share of finished streams whose worst "
                       f"gap exceeded {gap_s}s (the dashed line's gap).", Phase.DECODE,
                       [Query(promql.share_above(names.MAX_GAP, config.worst_gap_threshold_s,
                                                 st, RI, (BACKEND,)), legend(BACKEND))],
                       "percentunit", maximum=1), 12)  # fmt: skip

    lay.row("What prefills cost the other streams")
    lay.add(timeseries("Stutter cost", "User-seconds of frozen output per second caused by "
                       "prefills (stall minus baseline), of the chosen tenants' prefills: how many "
                       "streams are frozen on average.", Phase.STUTTER,
                       [Query(promql.counter_rate(names.STUTTER_COST, st, RI, (BACKEND,)),
                              legend(BACKEND))], "short"), 12)  # fmt: skip
    lay.add(timeseries("Streams stalled per prefill", "How many other streams one request's "
                       "prefill stalled: mean and p99 per finished prefill of the chosen "
                       "tenants.", Phase.STUTTER,
                       [Query(promql.mean(stalled, st, RI, (BACKEND,)),
                              f"mean {legend(BACKEND)}"),
                        Query(promql.quantile(0.99, stalled, st, RI, (BACKEND,)),
                              f"p99 {legend(BACKEND)}")], "short"), 12)  # fmt: skip
    lay.add(timeseries("Stream time frozen by prefills", f"Stutter cost over active streams "
                       f"({w}, all tenants): the share of all output time lost to prefills; alert "
                       "above the line.", Phase.STUTTER,
                       [Query(stutter_share, legend(BACKEND, "instance"))], "percentunit",
                       threshold=stutter_line), 12)  # fmt: skip
    lay.add(timeseries("Stream time in unattributed stalls", f"Unattributed stall seconds over "
                       f"active streams ({w}, all tenants): output time lost to the backend's own "
                       "hiccups; alert above the line.", Phase.DECODE,
                       [Query(unattributed_share, legend(BACKEND, "instance"))], "percentunit",
                       threshold=unattributed_line), 12)  # fmt: skip

    lay.row("The trade: first token against smooth output")
    lay.add(timeseries(
        "TTFT next to prefill stall rate", "TTFT p90 (left) and prefill stalls per second "
        "(right): a smaller prefill chunk lowers stalls and raises TTFT.", Phase.PREFILL,
        [Query(promql.quantile(0.9, names.TTFT, st, RI, (BACKEND,)),
               f"TTFT p90 {legend(BACKEND)}"),
         Query(promql.counter_rate(names.STALLS, prefill, RI, (BACKEND,)),
               f"prefill stalls/s {legend(BACKEND)}")],
        "s", overrides=[right_axis("B", "short")]), 24, 9)  # fmt: skip

    _who_stalls_whom(lay, config)
    _trade_on_this_backend(lay, s)

    return dashboard(
        config,
        uid=UID,
        title="tokenstamp / Prefill stutter",
        description="How much one request's prefill freezes every other stream of its "
        "backend, and what chunked prefill trades for it.",
        panels=lay.panels,
        variables=[
            request_label_variable(config, "backend", "Backend", BACKEND),
            tenant_variable(config, f'{BACKEND}=~"$backend"'),
        ],
        annotations=(
            prometheus_annotation(
                "Stutter bursts",
                _burst_expr(config),
                "Stutter burst on {{server_address}}",
                f"Prefills froze more than {promql.num(config.stutter_share_threshold * 100)}% "
                f"of stream time over {config.burst_window}",
                "orange",
            ),
        ),
    )
