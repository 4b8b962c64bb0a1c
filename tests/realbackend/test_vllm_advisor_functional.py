"""The chunk-size advisor on vLLM: fitted at one ``--max-num-batched-tokens``, checked at the other.

vLLM V1 always chunks prefill: ``--max-num-batched-tokens`` is the token budget of one
engine step, the decoding streams' tokens first, the rest to the prompt. At 2048 the
measured prompt (1,200 tokens and the template's) is one step beside 8 decoding streams;
at 512 it takes three (504, 504 and the rest).

Each budget gets one server and one pass of the same workload through the proxy:

* *fit*: 8 streams that end one after another (decode steps at 8 down to 1 streams),
  while prompts of 1,200, 800 and 600 tokens come one at a time; at 512 their last
  pieces (about 200, 300 and 100 tokens) tell a fixed cost per prefill step from the
  rate, as in the llama.cpp test;
* *measured*: 8 streams and one 1,200-token prompt, through a second proxy with the
  advisor off.

The fit at one budget is asked (``/advice``) for the other budget's row, and every cell
is set against the other budget's measured run: an existing stream's worst gap while the
prompt is prefilled, its token rate over the steps that carried the prompt, the new
request's first token, the stalls per stream; and vLLM's own prefill time of the prompt
(its per-request ``metrics``: scheduled to first token), which is the predicted window.
vLLM's per-request prefill times of the fit's own prompts check the fitted rate.

The two servers are the session's (2048, the CPU build's default, shared with the
metrics test) and one started here at 512: one server start more than that test.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.realbackend.advisorload import (
    Direction,
    FitRun,
    Measured,
    advice,
    keep_for_replay,
    measured_run,
    timeline,
    undisturbed_fit,
    undisturbed_measured,
)
from tests.realbackend.client import Prompts
from tests.realbackend.recorder import ProxyFactory, RecordedProxy
from tests.realbackend.vllm_server import VllmServer

pytestmark = [pytest.mark.realbackend, pytest.mark.vllm, pytest.mark.timeout(600)]

STREAMS = 8
LONG = 1200
"""The measured long prompt (at 512: pieces of 504, 504 and the rest)."""
FIT_PROMPTS = (1200, 800, 600)
"""The long prompts the advisor fits from, one at a time."""
KNOB = "--max-num-batched-tokens"
BUDGETS = (2048, 512)
"""``--max-num-batched-tokens`` of the session's server and of the one started here."""
PREFILL_S_PER_TOKEN = 1 / 1000
"""About what this CPU takes per prompt token (sizes the streams, not a tolerance)."""
TOLERANCE = 0.20
"""Each predicted time or rate against the measured one, both ways, from either fit
(docs/advisor.md#validation: every cell within 11.9% in the 3 runs of 2026-12-07).
Earlier, fitted at 512: -19% to -25% twice where a whole prompt cost more per token than
its pieces, -52% once with the machine at half speed. Fitted at 2048, whose 512 row
extrapolates a piece after context of its own (the advice marks the row so): +58% twice,
once where the context term ``x (L + x)`` kept without a step cost beside it put the whole
prompts' superlinear cost on the context before a piece (this engine's pieces after context
cost what the first does), once with the machine at half speed."""
ENGINE_TOLERANCE = 0.25
"""The fit's window for each of its own prompts against vLLM's own prefill time (within 19.3%
in the 3 runs of 2026-12-07, within 25% in 6 of 8 before; +31% and +34% in a 2048 fit that read the API server's late first token as
a second piece, before the fit dropped such a step; +77% with the machine at half speed)."""


@dataclass(frozen=True, slots=True)
class EngineCheck:
    """One fit prompt: vLLM's own prefill time of it against the fit's window for it."""

    prompt_tokens: int
    streams: int
    """Streams decoding through its whole window."""
    engine_prefill_s: float
    predicted_s: float
    """The fit's row at the fit's own chunk: its steps' sum (TTFT minus half a decode step)."""
    gaps_ms: tuple[tuple[int, ...], ...]
    """Each stream decoding through it: its gaps from the one before it was forwarded to the
    one after its first token, ms (what the advisor counts the steps that carried it by)."""


async def _engine_checks(proxy: RecordedProxy, fit: dict[str, Any]) -> list[EngineCheck]:
    """vLLM's per-request prefill time of each fit prompt against what the fit says of it."""
    out = []
    chunk = str(fit["chunk_size"]) if fit["chunked"] else "none"
    d = fit["decode_step_s"]
    for k in range(len(FIT_PROMPTS)):
        rid = f"fit-long-{k}"
        record = proxy.sink.requests[rid]
        timings = record.backend_timings
        if timings is None or timings.prefill_s is None or record.prompt_tokens is None:
            continue
        tf = proxy.watcher.forwarded_ns[rid]
        t1 = proxy.watcher.output_ns[rid][0]
        through = [
            i
            for i in range(STREAMS)
            if proxy.watcher.output_ns[f"fit-{i}"][0] < tf
            and proxy.watcher.finished_ns[f"fit-{i}"] > t1
        ]
        streams = len(through)
        gaps = []
        for i in through:
            stamps = proxy.watcher.output_ns[f"fit-{i}"]
            first = max((k for k, t in enumerate(stamps) if t <= tf), default=0)
            last = next((k for k, t in enumerate(stamps) if t > t1), len(stamps) - 1)
            pairs = itertools.pairwise(stamps[first : last + 2])
            gaps.append(tuple(round((b - a) / 1e6) for a, b in pairs))
        (row,) = (await advice(proxy.admin_url, record.prompt_tokens, streams, chunk))["table"]
        window = row["ttft_s"] - (d["base"] + d["per_stream"] * streams) / 2
        out.append(
            EngineCheck(record.prompt_tokens, streams, timings.prefill_s, window, tuple(gaps))
        )
    return out


def _held_outside_vllm(proxy: RecordedProxy) -> str | None:
    """A fit prompt whose window (forwarded to first token, the proxy's stamps) outlasted vLLM's
    own time for it (queued and prefilled) by half and more: the API server or the machine held
    the request or its first token, and every stream's tokens with it (seen once: a 4.9 s window
    of a prompt vLLM prefilled in 395 ms, the streams' tokens then in one burst)."""
    for k in range(len(FIT_PROMPTS)):
        rid = f"fit-long-{k}"
        record = proxy.sink.requests.get(rid)
        timings = record.backend_timings if record is not None else None
        if timings is None or timings.prefill_s is None:
            continue  # a vLLM without per-request metrics: nothing to tell it by
        engine_s = timings.prefill_s + (timings.queue_s or 0.0)
        window_s = (proxy.watcher.output_ns[rid][0] - proxy.watcher.forwarded_ns[rid]) / 1e9
        if window_s > 1.5 * engine_s + 0.05:
            return (
                f"{rid}'s window was {window_s * 1e3:.0f} ms where vLLM queued and prefilled it "
                f"in {engine_s * 1e3:.0f}: the request was held outside the engine"
            )
    return None


def _stream_tokens(step_s: float) -> int:
    """The 8 streams step slower than one: they outlast the wait, three times the prefill and
    more (twice was once too little on a machine that slowed down after the probe)."""
    return int((20 * step_s + 1.0 + 3 * LONG * PREFILL_S_PER_TOKEN) / step_s) + 40


def _engine_lines(checks: list[EngineCheck]) -> list[str]:
    return [
        f"  fit prompt {e.prompt_tokens} tokens, {e.streams} streams: vLLM's own prefill "
        f"{e.engine_prefill_s * 1e3:.0f} ms, the fit's window {e.predicted_s * 1e3:.0f} ms "
        f"({e.predicted_s / e.engine_prefill_s - 1:+.1%}); the streams' gaps (ms) "
        + " | ".join(" ".join(map(str, g)) for g in e.gaps_ms)
        for e in checks
    ]


def _engine_failures(fit_budget: int, checks: list[EngineCheck]) -> list[str]:
    return [
        f"fit at {fit_budget}, its own {e.prompt_tokens}-token prompt: window "
        f"{e.predicted_s:.3f} s, vLLM's prefill {e.engine_prefill_s:.3f} s"
        for e in checks
        if abs(e.predicted_s - e.engine_prefill_s) > ENGINE_TOLERANCE * e.engine_prefill_s
    ]


async def test_fit_at_one_budget_predicts_the_other(
    vllm: VllmServer,
    vllm_factory: Callable[[int], VllmServer],
    recorded_proxy: ProxyFactory,
) -> None:
    """Fitted at 2048 (prompts unchunked, and found so) the 512 row, fitted at 512 (prompts
    found chunked) the 2048 row: every cell within ``TOLERANCE``, the stalls exact."""
    fits: dict[int, RecordedProxy] = {}
    fit_runs: dict[int, FitRun] = {}
    measured: dict[int, Measured] = {}
    for budget in BUDGETS:
        server = vllm if budget == vllm.max_num_batched_tokens else None
        if server is None:
            server = await asyncio.to_thread(vllm_factory, budget)
        prompts = Prompts(server.model / "tokenizer.json", f"advisor-{budget}")
        fits[budget], fit_runs[budget] = await undisturbed_fit(
            f"fit at {budget}",
            functools.partial(recorded_proxy, server.url, provider="vllm"),
            prompts,
            FIT_PROMPTS,
            streams=STREAMS,
            prefill_s_per_token=PREFILL_S_PER_TOKEN,
            held_outside=_held_outside_vllm,
        )
        measured[budget] = await undisturbed_measured(
            f"measured at {budget}",
            functools.partial(recorded_proxy, server.url, provider="vllm", advisor=False),
            functools.partial(
                measured_run,
                prompts=prompts,
                budget=budget,
                streams=STREAMS,
                long_prompt=LONG,
                stream_tokens=_stream_tokens,
            ),
        )
    report, failures = [], []
    by_budget: dict[int, Direction] = {}
    engine_seen = []
    for fit_budget, other in itertools.permutations(BUDGETS):
        m = measured[other]
        # The row of the prompt piece the other budget leaves beside the decoding streams.
        piece = str(other - STREAMS)
        backend = await advice(fits[fit_budget].admin_url, m.prompt_tokens, STREAMS, piece)
        assert backend["status"] == "ok", (
            f"fit at {fit_budget}: {backend['missing']}\n"
            f"observations {backend['fit']['observations']}\n{timeline(fits[fit_budget])}"
        )
        d = Direction(KNOB, fit_budget, STREAMS, backend, m, fit_runs[fit_budget])
        by_budget[fit_budget] = d
        keep_for_replay(fits[fit_budget], d)
        engine = await _engine_checks(fits[fit_budget], d.fit)
        engine_seen.append(bool(engine))
        report += [d.table(), *_engine_lines(engine)]
        failures += d.failures(TOLERANCE)
        failures += _engine_failures(fit_budget, engine)
    print("\n" + "\n".join(report))
    # Whether the 2048 fit finds prompts unchunked is printed, not asserted: the API server's
    # late first token made a second "piece" in 2 of 4 runs (chunks 255 and 571) before the
    # fit dropped such a step, in none of 4 since. The chunk found at 512 is printed, not
    # bounded: 436-520 over 8 runs (the piece is 504).
    if by_budget[512].fit["chunked"] is not True:
        failures.append(f"fit at 512: chunked {by_budget[512].fit['chunked']}, not True")
    if vllm.per_request_metrics:
        assert all(engine_seen), "vLLM sent no per-request metrics"
    assert not failures, "\n".join(report + failures)
