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
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from proxy.advisor.predict import pieces
from tests.realbackend.advisorload import (
    decode_step_s,
    fit_workload,
    read_stream,
    window_cells,
)
from tests.realbackend.client import Prompts, chat
from tests.realbackend.recorder import ProxyFactory, RecordedProxy
from tests.realbackend.vllm_server import VllmServer

pytestmark = [pytest.mark.realbackend, pytest.mark.vllm, pytest.mark.timeout(600)]

STREAMS = 8
LONG = 1200
"""The measured long prompt (at 512: pieces of 504, 504 and the rest)."""
FIT_PROMPTS = (1200, 800, 600)
"""The long prompts the advisor fits from, one at a time."""
BUDGETS = (2048, 512)
"""``--max-num-batched-tokens`` of the session's server and of the one started here."""
PREFILL_S_PER_TOKEN = 1 / 1000
"""About what this CPU takes per prompt token (sizes the streams, not a tolerance)."""
TOLERANCE = 0.20
"""Each predicted time or rate against the measured one, both ways (on a loaded machine,
docs/advisor.md#validation: every cell within 15.7% in the 3 runs of the code as it stands;
over 8 runs, fitted at 512 within 11% in 5, -19% to -25% and the rate +23% to +26% in 2 (a
whole prompt costs more per token than its pieces, which a fit on pieces without a context
term does not see) and -52% once with the machine at half speed)."""
WHOLE_PROMPT_TOLERANCE = 0.20
"""The 512 row predicted by the fit at 2048: a fit on whole prompts extrapolates a piece
after context of its own (the advice marks the row so). Within 12.5% in the 3 runs of the
code as it stands; over 8 runs +58% twice: once the context term ``x (L + x)`` kept
without a step cost beside it put the whole prompts' superlinear cost on the context before
a piece (this engine's pieces after context cost what the first does), once the machine at
half speed."""
ENGINE_TOLERANCE = 0.25
"""The fit's window for each of its own prompts against vLLM's own prefill time (within 25%
in 6 of 8 runs; +31% and +34% in a 2048 fit that read the API server's late first token as
a second piece, before the fit dropped such a step; +77% with the machine at half speed)."""


@dataclass(frozen=True, slots=True)
class Measured:
    """One budget's measured run: what the streams and the new request saw."""

    budget: int
    prompt_tokens: int
    """The long request's prompt (vLLM's usage: the text and the chat template)."""
    worst_gap_s: float
    """Median over streams of each one's worst gap in the prefill window."""
    rate_per_s: float
    """Median over streams of its tokens per second over the gaps that carried the prompt."""
    ttft_s: float
    """The long request's first token, as the proxy measured it."""
    stalls: int
    """Median over streams of the stalls the proxy attributed to the long request."""
    steps: int
    """Median over streams of the gaps that carried the prompt."""
    engine_prefill_s: float | None
    """vLLM's own: the long request scheduled to its first token (per-request metrics)."""
    decode_step_s: float
    """Median gap of the streams outside the window."""


async def _measured_run(proxy: RecordedProxy, prompts: Prompts, budget: int) -> Measured:
    """8 streams, one long prompt: what each cell of the advisor's row is measured as."""
    step_s = await decode_step_s(proxy, prompts, "m-probe")
    text = prompts.text(LONG)
    # The 8 streams step slower than one: they outlast the wait, three times the prefill and
    # more (twice was once too little on a machine that slowed down after the probe).
    tokens = int((20 * step_s + 1.0 + 3 * LONG * PREFILL_S_PER_TOKEN) / step_s) + 40
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with asyncio.TaskGroup() as group:
            for i in range(STREAMS):
                body = chat(prompts.text(24), tokens)
                group.create_task(read_stream(session, proxy.url, body, f"m-{i}"))
            await asyncio.sleep(20 * step_s + 1.0)
            await read_stream(session, proxy.url, chat(text, 2), "m-long")
    proxy.settle()
    cells = window_cells(proxy, "m-long", [f"m-{i}" for i in range(STREAMS)])
    record = proxy.sink.requests["m-long"]
    assert record.prompt_tokens is not None, "vLLM sent no usage"
    assert record.ttft_s is not None
    timings = record.backend_timings
    return Measured(
        budget=budget,
        prompt_tokens=record.prompt_tokens,
        worst_gap_s=cells.worst_gap_s,
        rate_per_s=cells.rate_per_s,
        ttft_s=record.ttft_s,
        stalls=cells.stalls,
        steps=cells.steps,
        engine_prefill_s=timings.prefill_s if timings is not None else None,
        decode_step_s=cells.decode_step_s,
    )


async def _advice(admin_url: str, prompt_tokens: int, streams: int, chunk: str) -> dict[str, Any]:
    query = {"prompt_tokens": str(prompt_tokens), "streams": str(streams), "chunk_sizes": chunk}
    async with aiohttp.ClientSession() as session:
        async with session.get(admin_url + "/advice", params=query) as resp:
            data: dict[str, Any] = await resp.json()
    (backend,) = data["backends"]
    assert isinstance(backend, dict)
    return backend


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
        (row,) = (await _advice(proxy.admin_url, record.prompt_tokens, streams, chunk))["table"]
        window = row["ttft_s"] - (d["base"] + d["per_stream"] * streams) / 2
        out.append(
            EngineCheck(record.prompt_tokens, streams, timings.prefill_s, window, tuple(gaps))
        )
    return out


@dataclass(frozen=True, slots=True)
class Direction:
    """The fit at one budget against the other budget's measured run."""

    fit_budget: int
    engine_name: str
    """What the advice says it fitted."""
    fit: dict[str, Any]
    row: dict[str, Any]
    measured: Measured
    engine: list[EngineCheck]

    @property
    def steps(self) -> int:
        """Steps the advisor splits the prompt into at the measured budget: each one a stall
        of every stream (the prompt's pieces here all cost several decode steps)."""
        return len(pieces(self.row["prompt_tokens"], self.row["chunk_size"]))

    def cells(self) -> list[tuple[str, float, float]]:
        """(cell, predicted, measured) of every timed cell."""
        m, row = self.measured, self.row
        d = self.fit["decode_step_s"]
        cells = [
            ("worst gap (ms)", row["worst_gap_s"] * 1e3, m.worst_gap_s * 1e3),
            ("rate during prefill (tokens/s)", row["rate_during_prefill_per_s"], m.rate_per_s),
            ("first token (ms)", row["ttft_s"] * 1e3, m.ttft_s * 1e3),
        ]
        if m.engine_prefill_s is not None:
            window = row["ttft_s"] - (d["base"] + d["per_stream"] * STREAMS) / 2
            cells.append(("vLLM's own prefill (ms)", window * 1e3, m.engine_prefill_s * 1e3))
        return cells

    def table(self) -> str:
        """The validation table: fitted, then predicted against measured."""
        fit, m = self.fit, self.measured
        d = fit["decode_step_s"]
        obs = fit["observations"]
        chunk = f"chunk {fit['chunk_size']}" if fit["chunked"] else "prompts unchunked"
        lines = [
            f"vLLM fitted at --max-num-batched-tokens {self.fit_budget} -> measured at "
            f"{m.budget}: {m.prompt_tokens}-token prompt, {STREAMS} streams decoding",
            f"  fitted: decode {d['base'] * 1e3:.1f} ms + {d['per_stream'] * 1e3:.2f} ms x "
            f"streams, prefill {fit['prefill_tokens_per_s']:.0f} tokens/s, "
            f"{fit['prefill_step_s'] * 1e3:.0f} ms a prefill step, "
            f"{fit['prefill_context_s'] * 1e9:.0f} ns more a token per token of context, {chunk}",
            *(f"  {obs[k]}" for k in ("prefill_step_note", "prefill_context_note") if obs.get(k)),
            f"  engine: {self.engine_name}; extrapolation: {self.row['extrapolation'] or 'none'}",
            f"  measured decode step outside the window {m.decode_step_s * 1e3:.1f} ms",
            f"  {'cell':32} {'predicted':>10} {'measured':>10} {'error':>7}",
        ]
        for name, p, v in self.cells():
            lines.append(
                f"  {name:32} {p:10.{2 if p < 100 else 0}f} {v:10.{2 if v < 100 else 0}f} {p / v - 1:+7.1%}"
            )
        lines.append(f"  {'stalls per stream':32} {self.steps:10d} {m.stalls:10d}")
        lines.append(f"  {'steps that carried the prompt':32} {self.steps:10d} {m.steps:10d}")
        for e in self.engine:
            lines.append(
                f"  fit prompt {e.prompt_tokens} tokens, {e.streams} streams: vLLM's own prefill "
                f"{e.engine_prefill_s * 1e3:.0f} ms, the fit's window {e.predicted_s * 1e3:.0f} ms "
                f"({e.predicted_s / e.engine_prefill_s - 1:+.1%}); the streams' gaps (ms) "
                + " | ".join(" ".join(map(str, g)) for g in e.gaps_ms)
            )
        return "\n".join(lines)

    def failures(self) -> list[str]:
        """Every cell outside the bound, one line each."""
        whole = self.fit_budget > self.measured.budget  # fitted unchunked, predicting pieces
        out = [
            f"fit at {self.fit_budget}, {name}: predicted {p:.1f}, measured {v:.1f}"
            for name, p, v in self.cells()
            if abs(p - v) > (WHOLE_PROMPT_TOLERANCE if whole else TOLERANCE) * v
        ]
        if self.steps != self.measured.stalls:
            out.append(f"fit at {self.fit_budget}: stalls {self.steps} predicted, "
                       f"{self.measured.stalls} measured")  # fmt: skip
        out += [
            f"fit at {self.fit_budget}, its own {e.prompt_tokens}-token prompt: window "
            f"{e.predicted_s:.3f} s, vLLM's prefill {e.engine_prefill_s:.3f} s"
            for e in self.engine
            if abs(e.predicted_s - e.engine_prefill_s) > ENGINE_TOLERANCE * e.engine_prefill_s
        ]
        return out


async def test_fit_at_one_budget_predicts_the_other(
    vllm: VllmServer,
    vllm_factory: Callable[[int], VllmServer],
    recorded_proxy: ProxyFactory,
) -> None:
    """Fitted at 2048 (prompts unchunked, and found so) the 512 row, fitted at 512 (prompts
    found chunked) the 2048 row: every cell within ``TOLERANCE`` (fitted on whole prompts,
    within ``WHOLE_PROMPT_TOLERANCE``), the stalls exact."""
    fits: dict[int, RecordedProxy] = {}
    measured: dict[int, Measured] = {}
    for budget in BUDGETS:
        server = vllm if budget == vllm.max_num_batched_tokens else None
        if server is None:
            server = await asyncio.to_thread(vllm_factory, budget)
        prompts = Prompts(server.model / "tokenizer.json", f"advisor-{budget}")
        fits[budget] = await recorded_proxy(server.url, provider="vllm")
        await fit_workload(
            fits[budget],
            prompts,
            FIT_PROMPTS,
            streams=STREAMS,
            prefill_s_per_token=PREFILL_S_PER_TOKEN,
        )
        measured_proxy = await recorded_proxy(server.url, provider="vllm", advisor=False)
        measured[budget] = await _measured_run(measured_proxy, prompts, budget)
    directions = []
    for fit_budget, other in itertools.permutations(BUDGETS):
        m = measured[other]
        # The row of the prompt piece the other budget leaves beside the decoding streams.
        piece = str(other - STREAMS)
        backend = await _advice(fits[fit_budget].admin_url, m.prompt_tokens, STREAMS, piece)
        assert backend["status"] == "ok", backend["missing"]
        (row,) = backend["table"]
        engine = await _engine_checks(fits[fit_budget], backend["fit"])
        name = backend["engine"]["name"]
        directions.append(Direction(fit_budget, name, backend["fit"], row, m, engine))
    report = "\n".join(d.table() for d in directions)
    print("\n" + report)
    failures = [f for d in directions for f in d.failures()]
    by_budget = {d.fit_budget: d for d in directions}
    # Whether the 2048 fit finds prompts unchunked is printed, not asserted: the API server's
    # late first token made a second "piece" in 2 of 4 runs (chunks 255 and 571) before the
    # fit dropped such a step, in none of 4 since. The chunk found at 512 is printed, not
    # bounded: 436-520 over 8 runs (the piece is 504).
    if by_budget[512].fit["chunked"] is not True:
        failures.append(f"fit at 512: chunked {by_budget[512].fit['chunked']}, not True")
    if vllm.per_request_metrics:
        assert all(d.engine for d in directions), "vLLM sent no per-request metrics"
    assert not failures, report + "\n" + "\n".join(failures)
