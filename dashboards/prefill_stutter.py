"""The "Prefill stutter" dashboard: how much one request's prefill freezes the others.

Stalls by cause, their durations, the user-seconds of frozen output prefills
cost, how many streams one prefill stalls, the share of streams that stalled,
and TTFT next to the stall rate: the trade the prefill chunk size controls.
Thresholds are the alerts'; annotations mark minutes where stutter bursts.
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
    thresholds,
    timeseries,
)
from exporters import names

UID = "tokenstamp-prefill-stutter"
BACKEND = names.label_name(names.SERVER_ADDRESS)
CAUSE = names.label_name(names.STALL_CAUSE)
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


def build(config: Config) -> Json:
    """The dashboard JSON model."""
    has_backend = f'{BACKEND}=~"$backend"'
    s = rules.sel(config, has_backend)
    prefill = rules.sel(config, has_backend, f'{CAUSE}="prefill"')
    unattributed = rules.sel(config, has_backend, f'{CAUSE}="unattributed"')
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
                 f"backends, of stream time frozen by other requests' prefills ({w}); the "
                 "alert threshold turns it red.", Phase.STUTTER, Query(f"max({stutter_share})"),
                 "percentunit", thresholds(("green", None),
                                           ("red", config.stutter_share_threshold))),
            6, 5)  # fmt: skip
    lay.add(stat("Prefill stalls per second", "Stalls per second that an overlapping prefill "
                 "explains.", Phase.STUTTER,
                 Query(promql.counter_rate(names.STALLS, prefill, RI)), "short"), 6, 5)  # fmt: skip
    lay.add(stat("Unattributed stalls per second", "Stalls per second with no prefill to "
                 "blame: the backend itself hiccuped.", Phase.DECODE,
                 Query(promql.counter_rate(names.STALLS, unattributed, RI)), "short"),
            6, 5)  # fmt: skip
    lay.add(stat(f"Streams with a gap over {gap_s}s", f"Share of finished streams whose worst "
                 f"inter-token gap exceeded {gap_s}s.", Phase.DECODE,
                 Query(promql.share_above(names.MAX_GAP, config.worst_gap_threshold_s, s, RI)),
                 "percentunit"), 6, 5)  # fmt: skip

    lay.row("Stalls")
    lay.add(timeseries("Stalls per second by cause", "Gaps far above their stream's baseline, "
                       "per second: prefill when a culprit's prefill overlapped, else "
                       "unattributed.", Phase.STUTTER,
                       [Query(promql.counter_rate(names.STALLS, s, RI, (BACKEND, CAUSE)),
                              legend(CAUSE, BACKEND))], "short"), 12)  # fmt: skip
    lay.add(heatmap("Stall durations", "Stalls per duration bucket over time, both causes: how "
                    "long output froze each time.", Phase.STUTTER,
                    buckets(names.STALL_DURATION, s, RI), "s"), 12)  # fmt: skip
    lay.add(timeseries("Stall duration p50 / p99 by cause", "Median and p99 length of one stall, "
                       "by cause.", Phase.STUTTER,
                       percentiles(names.STALL_DURATION, s, RI, CAUSE, (0.5, 0.99)),
                       "s", threshold=line_at(config.worst_gap_threshold_s, "orange")),
            12)  # fmt: skip
    lay.add(timeseries("Share of streams that stalled", f"Share of finished streams whose worst "
                       f"gap exceeded {gap_s}s (the dashed line's gap).", Phase.DECODE,
                       [Query(promql.share_above(names.MAX_GAP, config.worst_gap_threshold_s,
                                                 s, RI, (BACKEND,)), legend(BACKEND))],
                       "percentunit", maximum=1), 12)  # fmt: skip

    lay.row("What prefills cost the other streams")
    lay.add(timeseries("Stutter cost", "User-seconds of frozen output per second caused by "
                       "prefills (stall minus baseline): how many streams are frozen on "
                       "average.", Phase.STUTTER,
                       [Query(promql.counter_rate(names.STUTTER_COST, s, RI, (BACKEND,)),
                              legend(BACKEND))], "short"), 12)  # fmt: skip
    lay.add(timeseries("Streams stalled per prefill", "How many other streams one request's "
                       "prefill stalled: mean and p99 per finished prefill.", Phase.STUTTER,
                       [Query(promql.mean(stalled, s, RI, (BACKEND,)), f"mean {legend(BACKEND)}"),
                        Query(promql.quantile(0.99, stalled, s, RI, (BACKEND,)),
                              f"p99 {legend(BACKEND)}")], "short"), 12)  # fmt: skip
    lay.add(timeseries("Stream time frozen by prefills", f"Stutter cost over active streams "
                       f"({w}): the share of all output time lost to prefills; alert above the "
                       "line.", Phase.STUTTER,
                       [Query(stutter_share, legend(BACKEND, "instance"))], "percentunit",
                       threshold=stutter_line), 12)  # fmt: skip
    lay.add(timeseries("Stream time in unattributed stalls", f"Unattributed stall seconds over "
                       f"active streams ({w}): output time lost to the backend's own hiccups; "
                       "alert above the line.", Phase.DECODE,
                       [Query(unattributed_share, legend(BACKEND, "instance"))], "percentunit",
                       threshold=unattributed_line), 12)  # fmt: skip

    lay.row("The trade: first token against smooth output")
    ttft_by = rules.sel(config, has_backend)
    lay.add(timeseries(
        "TTFT next to prefill stall rate", "TTFT p90 (left) and prefill stalls per second "
        "(right): a smaller prefill chunk lowers stalls and raises TTFT.", Phase.PREFILL,
        [Query(promql.quantile(0.9, names.TTFT, ttft_by, RI, (BACKEND,)),
               f"TTFT p90 {legend(BACKEND)}"),
         Query(promql.counter_rate(names.STALLS, prefill, RI, (BACKEND,)),
               f"prefill stalls/s {legend(BACKEND)}")],
        "s", overrides=[right_axis("B", "short")]), 24, 9)  # fmt: skip

    _trade_on_this_backend(lay, s)

    return dashboard(
        config,
        uid=UID,
        title="tokenstamp / Prefill stutter",
        description="How much one request's prefill freezes every other stream of its "
        "backend, and what chunked prefill trades for it.",
        panels=lay.panels,
        variables=[request_label_variable(config, "backend", "Backend", BACKEND)],
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
