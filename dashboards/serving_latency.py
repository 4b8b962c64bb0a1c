"""The "Serving latency" dashboard: prefill (TTFT) and decode (TPOT, gaps) apart.

Latency percentiles per backend, the distributions behind them, thinking
(reasoning) against answering, what share of a request is decode, outcomes,
throughput, goodput and SLO burn, and the same per tenant. Variables: data
source, backend (``server_address``), model (``gen_ai_request_model``), tenant
(``tokenstamp_tenant``, "All" when the proxy does not label tenants).
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
    request_label_variable,
    stat,
    tenant_variable,
    thresholds,
    timeseries,
)
from dashboards.promql import TENANT, TENANT_MATCHER, by_tenant
from exporters import names

UID = "tokenstamp-serving-latency"
BACKEND = names.label_name(names.SERVER_ADDRESS)
MODEL = names.label_name(names.REQUEST_MODEL)
SLO = names.label_name(names.SLO)
SLO_SOURCE = names.label_name(names.SLO_SOURCE)
QUANTILES = (0.5, 0.9, 0.99)
RI = promql.RATE_INTERVAL


def _percentiles(inst: names.Instrument, sel: str) -> list[Query]:
    return percentiles(inst, sel, RI, BACKEND, QUANTILES)


def _share(inst: names.Instrument, part: str, whole: str, labels: tuple[str, ...] = ()) -> str:
    """Rate of counter ``inst`` matching selector ``part`` over its rate matching ``whole``."""
    return promql.ratio(
        promql.counter_rate(inst, part, RI, labels), promql.counter_rate(inst, whole, RI, labels)
    )


def _burn(
    config: Config,
    template: str,
    objective: float,
    title: str,
    what: str,
    phase: Phase,
    labels: tuple[str, ...],
    *matchers: str,
) -> Json:
    budget = promql.num(1 - objective)
    sel = promql.matchers(f'{BACKEND}=~"$backend"', *matchers)
    steps = sorted({w.factor for w in config.burn_windows})
    colors = ("yellow", "orange", "red", "dark-red")
    scope = "filtered by tenant, not by model" if matchers else "not filtered by model or tenant"
    return timeseries(
        title,
        f"How fast {what} spend the error budget (1 = exactly on budget for "
        f"{config.slo_period}); the alert fires above the drawn lines, {scope}.",
        phase,
        [
            Query(f"{rules.record_name(template, w)}{sel} / {budget}", f"{w} {legend(*labels)}")
            for w in config.long_windows[:2]
        ],
        "none",
        threshold=thresholds(
            ("green", None), *((colors[min(i, 3)], f) for i, f in enumerate(steps))
        ),
    )


def _thinking(lay: Layout, config: Config, s: str, out_tokens: str) -> None:
    """TTFT beside the time to first answer token, reasoning time and tokens, tool calls.

    TTFT is the first output event of either kind; the first answer event (content,
    text, a tool call) comes after the reasoning. Without reasoning the two are equal.
    """
    answer = config.answer_ttft_target_s
    reasoning = promql.sum_of_rate(names.REASONING_TOKENS, s, RI, (BACKEND,))
    output = promql.sum_of_rate(names.TOKEN_USAGE, out_tokens, RI, (BACKEND,))
    lay.row("Thinking vs answering")
    lay.add(timeseries(
        "TTFT and time to first answer p50 / p90", "First output event (TTFT) beside the first "
        "answer event (content, text or a tool call, not reasoning): the gap is the time spent "
        "thinking, none without reasoning; dashed lines at the TTFT (orange) and answer (red) "
        "targets.", Phase.UNTIL_ANSWER,
        [Query(promql.quantile(q, inst, s, RI, (BACKEND,)), f"{what} p{q * 100:g} "
               f"{legend(BACKEND)}")
         for q in (0.5, 0.9) for inst, what in ((names.TTFT, "TTFT"),
                                                (names.ANSWER_TTFT, "answer"))],
        "s", threshold=thresholds(("green", None), ("orange", config.ttft_target_s),
                                  ("red", answer))), 12)  # fmt: skip
    lay.add(timeseries("Reasoning duration p50 / p90", "Per request that reasoned: its first "
                       "reasoning event to its first answer event (to its end when no answer "
                       "came).", Phase.REASONING,
                       percentiles(names.REASONING_DURATION, s, RI, BACKEND, (0.5, 0.9)),
                       "s"), 12)  # fmt: skip
    lay.add(timeseries("Reasoning share of output tokens", "Reasoning tokens over all output "
                       "tokens of finished requests: what share of the decode work the user "
                       "never reads (0 without reasoning).", Phase.REASONING,
                       [Query(promql.ratio(reasoning, output), legend(BACKEND))],
                       "percentunit", maximum=1), 8)  # fmt: skip
    lay.add(timeseries("Time to first tool call p90", "Arrival to the first tool-call event, "
                       "what a calling program waits for: 9 in 10 requests that called a tool "
                       "got it sooner.", Phase.UNTIL_ANSWER,
                       [Query(promql.quantile(0.9, names.TOOL_CALL_TTF, s, RI, (BACKEND,)),
                              f"p90 {legend(BACKEND)}")], "s"), 8)  # fmt: skip
    lay.add(timeseries(
        "Time to first answer SLO misses", "Share of requests whose first answer event came "
        "later than the answer target (without reasoning: TTFTs over that target).",
        Phase.UNTIL_ANSWER,
        [Query(promql.share_above(names.ANSWER_TTFT, answer, s, RI, (BACKEND,)),
               legend(BACKEND))],
        "percentunit", threshold=line_at(1 - config.answer_ttft_objective),
        maximum=1), 8)  # fmt: skip


def _tenants(lay: Layout, config: Config, s: str) -> None:
    """Goodput, its burn and latency per tenant; goodput by whose targets judged it."""
    slo = names.SLO_REQUESTS
    met = promql.matchers(s.strip("{}"), f'{SLO}="met"')
    own = promql.matchers(s.strip("{}"), f'{SLO_SOURCE}="request"')
    goodput_by_tenant = _share(slo, met, s, (TENANT,))
    goodput_by_source = _share(slo, met, s, (SLO_SOURCE,))
    own_share = _share(slo, own, s)
    objective = config.tenant_goodput_objective
    lay.row("Tenants")
    lay.add(timeseries("Goodput by tenant", "Share of each tenant's finished streams that met "
                       "both targets, their own when the request sent them, else the defaults; "
                       "one line for all without --tenant-header.", Phase.BOTH,
                       [Query(by_tenant(goodput_by_tenant), legend(TENANT))], "percentunit",
                       threshold=thresholds(("red", None), ("green", objective)),
                       maximum=1), 8)  # fmt: skip
    lay.add(timeseries("Goodput by SLO source", "Goodput of streams judged by the targets their "
                       "request sent (x-slo-ttft-ms, x-slo-tpot-ms: a gateway's promise) and by "
                       "the proxy's defaults, and the share of streams that sent their own.",
                       Phase.BOTH,
                       [Query(goodput_by_source, f"goodput, {legend(SLO_SOURCE)} targets"),
                        Query(own_share, "share with their own targets")],
                       "percentunit", maximum=1), 8)  # fmt: skip
    lay.add(_burn(config, rules.TENANT_GOODPUT_ERRORS, objective, "Tenant goodput burn rate",
                  "each tenant's missed streams", Phase.BOTH, (TENANT, BACKEND),
                  TENANT_MATCHER), 8)  # fmt: skip
    lay.add(timeseries("TTFT p90 by tenant", "Time to first token that 9 in 10 of each tenant's "
                       "requests beat; the dashed line is the default TTFT target.",
                       Phase.PREFILL,
                       [Query(by_tenant(promql.quantile(0.9, names.TTFT, s, RI, (TENANT,))),
                              legend(TENANT))], "s",
                       threshold=line_at(config.ttft_target_s)), 8)  # fmt: skip
    lay.add(timeseries("TPOT p90 by tenant", "Time per output token that 9 in 10 of each "
                       "tenant's streams beat; the dashed line is the default TPOT target.",
                       Phase.DECODE,
                       [Query(by_tenant(promql.quantile(0.9, names.TPOT, s, RI, (TENANT,))),
                              legend(TENANT))], "s",
                       threshold=line_at(config.tpot_target_s)), 8)  # fmt: skip
    backend = rules.sel(config, f'{BACKEND}=~"$backend"')
    other = rules.sel(config, f'{BACKEND}=~"$backend"', f'{TENANT}="other"')
    folded = _share(names.REQUESTS, other, backend, (BACKEND,))
    lay.add(timeseries("Requests folded into other", "Share of requests whose tenant was past "
                       "the proxy's tenant bound or allowlist and counted as other: when it "
                       "grows, the per-tenant panels hide tenants (not filtered by tenant).",
                       Phase.BOTH, [Query(folded, legend(BACKEND))], "percentunit",
                       maximum=1), 8)  # fmt: skip


def build(config: Config) -> Json:
    """The dashboard JSON model."""
    s = rules.sel(config, f'{BACKEND}=~"$backend"', f'{MODEL}=~"$model"', TENANT_MATCHER)
    out_tokens = rules.sel(
        config, f'{BACKEND}=~"$backend"', f'{MODEL}=~"$model"', TENANT_MATCHER,
        f'{names.label_name(names.TOKEN_TYPE)}="output"',
    )  # fmt: skip
    met = rules.sel(
        config, f'{BACKEND}=~"$backend"', f'{MODEL}=~"$model"', TENANT_MATCHER, f'{SLO}="met"',
    )  # fmt: skip
    slo = names.SLO_REQUESTS
    goodput = _share(slo, met, s)
    goodput_by = _share(slo, met, s, (BACKEND,))
    active = f"sum({names.STREAMS_ACTIVE.prom_series}{s})"
    tokens = promql.sum_of_rate(names.TOKEN_USAGE, out_tokens, RI)
    tokens_by = promql.sum_of_rate(names.TOKEN_USAGE, out_tokens, RI, (BACKEND,))
    ttft_sum = promql.sum_of_rate(names.TTFT, s, RI, (BACKEND,))
    duration_sum = promql.sum_of_rate(names.DURATION, s, RI, (BACKEND,))
    outcome = names.label_name(names.OUTCOME)
    status = names.label_name(names.STATUS_CODE)
    backend_only = promql.matchers(f'{BACKEND}=~"$backend"')
    w = config.rule_window

    lay = Layout()
    lay.row("Overview")
    lay.add(stat("Goodput", "Share of finished streams that met both the TTFT and the TPOT "
                 "target (and the answer target with --slo-answer-ttft).", Phase.BOTH,
                 Query(goodput), "percentunit",
                 thresholds(("red", None), ("orange", 0.9), ("green", 0.99))), 6, 5)  # fmt: skip
    lay.add(stat("Active streams", "Requests being answered right now, waiting for their first "
                 "token or streaming.", Phase.BOTH, Query(active), "short"), 6, 5)  # fmt: skip
    lay.add(stat("Requests per second", "Finished requests per second, any outcome.",
                 Phase.BOTH, Query(promql.counter_rate(names.REQUESTS, s, RI)), "reqps"),
            6, 5)  # fmt: skip
    lay.add(stat("Output tokens per second", "Output tokens per second, counted from usage when "
                 "each request finishes.", Phase.DECODE, Query(tokens), "short"), 6, 5)  # fmt: skip

    lay.row("Prefill: time to first token")
    lay.add(timeseries("TTFT p50 / p90 / p99", "Time from arrival at the proxy to the first "
                       "output token, counted the moment it arrives; the dashed line is the SLO "
                       "target.", Phase.PREFILL,
                       _percentiles(names.TTFT, s), "s",
                       threshold=line_at(config.ttft_target_s)), 12)  # fmt: skip
    lay.add(heatmap("TTFT distribution", "Requests per TTFT bucket over time: a second band "
                    "means a second population (cache hits, long prompts, queueing).",
                    Phase.PREFILL, buckets(names.TTFT, s, RI), "s"), 12)  # fmt: skip
    lay.add(timeseries(
        "TTFT by prefix cache", "Median and p90 TTFT of finished requests whose prompt prefix "
        "was cached (hit), not cached (miss) or not reported (unknown), counted at their end.",
        Phase.PREFILL,
        percentiles(names.PREFIX_CACHE_TTFT, s, RI, names.label_name(names.PREFIX_CACHE),
                    (0.5, 0.9)),
        "s"), 12)  # fmt: skip
    lay.add(timeseries(
        "TTFT SLO misses", "Share of requests whose first token came later than the TTFT "
        "target.", Phase.PREFILL,
        [Query(promql.share_above(names.TTFT, config.ttft_target_s, s, RI, (BACKEND,)),
               legend(BACKEND))],
        "percentunit", threshold=line_at(1 - config.ttft_objective), maximum=1), 12)  # fmt: skip

    _thinking(lay, config, s, out_tokens)

    lay.row("Decode: time per output token and gaps")
    lay.add(timeseries("TPOT p50 / p90 / p99", "Per finished stream: (last token - first token) "
                       "/ (tokens - 1); the dashed line is the SLO target.", Phase.DECODE,
                       _percentiles(names.TPOT, s), "s",
                       threshold=line_at(config.tpot_target_s)), 12)  # fmt: skip
    lay.add(heatmap("Inter-token gap", "Every gap between two consecutive output events of a "
                    "stream; stalls show as a band far above the decode step.", Phase.DECODE,
                    buckets(names.GAP, s, RI), "s"), 12)  # fmt: skip
    lay.add(timeseries("Worst gap per stream", "Percentiles of each finished stream's single "
                       "longest gap: the stutter a reader saw.", Phase.DECODE,
                       _percentiles(names.MAX_GAP, s), "s",
                       threshold=line_at(config.worst_gap_threshold_s, "orange")), 12)  # fmt: skip
    lay.add(timeseries("TPOT per token beside the gap per chunk", "Median time per output "
                       "token and median gap between output events: they part when a chunk "
                       "carries several tokens (speculative decoding, a stream interval).",
                       Phase.DECODE,
                       [Query(promql.quantile(0.5, names.TPOT, s, RI, (BACKEND,)),
                              f"TPOT per token p50 {legend(BACKEND)}"),
                        Query(promql.quantile(0.5, names.GAP, s, RI, (BACKEND,)),
                              f"gap per chunk p50 {legend(BACKEND)}")], "s"), 12)  # fmt: skip
    lay.add(timeseries("Tokens per output event", "Per finished stream: completion tokens / "
                       "output events (1 = one token per chunk), and the mean speculative "
                       "acceptance length where the backend reports it.", Phase.DECODE,
                       [*percentiles(names.TOKENS_PER_EVENT, s, RI, BACKEND, (0.5, 0.9)),
                        Query(promql.mean(names.ACCEPTANCE_LENGTH, s, RI, (BACKEND,)),
                              f"acceptance length {legend(BACKEND)}")],
                       "short"), 12)  # fmt: skip
    lay.add(timeseries("Output tokens per second", "Output tokens per second per backend, "
                       "counted from usage when each request finishes.", Phase.DECODE,
                       [Query(tokens_by, legend(BACKEND))], "short"), 12)  # fmt: skip

    lay.row("Requests")
    lay.add(timeseries("Request duration p50 / p90 / p99", "Arrival at the proxy to the end "
                       "of the response, any outcome.", Phase.BOTH,
                       _percentiles(names.DURATION, s), "s"), 8)  # fmt: skip
    lay.add(timeseries("Decode share of request time", "1 - total TTFT / total duration: the "
                       "part of the time users spend reading tokens as they arrive.", Phase.BOTH,
                       [Query(f"1 - (\n{ttft_sum}\n/\n{duration_sum}\n)", legend(BACKEND))],
                       "percentunit", maximum=1), 8)  # fmt: skip
    lay.add(timeseries("Requests by outcome", "Finished requests per second by outcome and "
                       "HTTP status class.", Phase.BOTH,
                       [Query(promql.counter_rate(names.REQUESTS, s, RI, (outcome, status)),
                              legend(outcome, status))],
                       "reqps", stack=True), 8)  # fmt: skip
    lay.add(timeseries("Active streams", "Requests in flight per backend: waiting for the "
                       "first token or streaming.", Phase.BOTH,
                       [Query(f"sum by ({BACKEND}) ({names.STREAMS_ACTIVE.prom_series}{s})",
                              legend(BACKEND))], "short"), 8)  # fmt: skip
    lay.add(timeseries("Upstream error ratio", f"Share of requests ending in "
                       f"{' or '.join(config.upstream_error_outcomes)} over {w} (alert input, "
                       "not filtered by model or tenant).", Phase.BOTH,
                       [Query(f"{rules.record_name(rules.UPSTREAM_ERRORS, w)}{backend_only}",
                              legend(BACKEND, "instance"))], "percentunit",
                       threshold=line_at(config.upstream_error_ratio_threshold)), 8)  # fmt: skip
    lay.add(timeseries("Decoder errors", f"Upstream events per second that could not be "
                       f"decoded over {w}: skipped and untimed, the bytes still flowed.",
                       Phase.BOTH,
                       [Query(f"{rules.record_name(rules.DECODER_ERRORS, w)}{backend_only}",
                              legend(BACKEND, "instance"))], "short"), 8)  # fmt: skip

    lay.row("SLO")
    lay.add(timeseries("Goodput per backend", "Share of finished streams that met both the "
                       "TTFT and the TPOT target (and the answer target with the proxy's "
                       "--slo-answer-ttft).", Phase.BOTH,
                       [Query(goodput_by, legend(BACKEND))], "percentunit",
                       maximum=1), 6)  # fmt: skip
    lay.add(_burn(config, rules.TTFT_ERRORS, config.ttft_objective, "TTFT SLO burn rate",
                  "TTFT misses", Phase.PREFILL, (BACKEND,)), 6)  # fmt: skip
    lay.add(_burn(config, rules.ANSWER_TTFT_ERRORS, config.answer_ttft_objective,
                  "Time to first answer SLO burn rate", "time-to-first-answer misses",
                  Phase.UNTIL_ANSWER, (BACKEND,)), 6)  # fmt: skip
    lay.add(_burn(config, rules.TPOT_ERRORS, config.tpot_objective, "TPOT SLO burn rate",
                  "TPOT misses", Phase.DECODE, (BACKEND,)), 6)  # fmt: skip

    _tenants(lay, config, s)

    return dashboard(
        config,
        uid=UID,
        title="tokenstamp / Serving latency",
        description="Prefill (time to first token) and decode (time per output token, every "
        "inter-token gap) measured apart, per backend, model and tenant.",
        panels=lay.panels,
        variables=[
            request_label_variable(config, "backend", "Backend", BACKEND),
            request_label_variable(config, "model", "Model", MODEL, f'{BACKEND}=~"$backend"'),
            tenant_variable(config, f'{BACKEND}=~"$backend"'),
        ],
    )
