"""What the advisor validations on real engines share: a stream read to its end, the one-stream
decode step that sizes their workloads to the machine, the fit's workload, the cells of a
measured prefill window as the existing streams saw it, the measured run, and a fit's row
set against it (``Direction``: the table and the cells outside a bound).

A run that measured the machine rather than the engine is run again, ``RUN_ATTEMPTS`` times
at most, and said so: the test's own loop held (``LoopLag``; the proxy under test runs on
it), a fit lacking data the workload always gives, a request held outside the engine by
the engine's own timings, or the streams' tokens arriving in bursts. The last run is kept
whatever it saw, and judged: a run is retried for what disturbed it, never for what it predicted."""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from proxy.advisor.predict import pieces
from proxy.edge.tasks import TaskSet
from tests.realbackend.client import Prompts, chat
from tests.realbackend.recorder import RecordedProxy

ELEVATED = 2.0
"""A gap carried a prompt piece when it is this many times the stream's median gap ..."""
PIECE_SHARE = 0.3
"""... and at least this share of the worst one: a small last piece still costs several
decode steps; an engine's API server, busy taking in the long request, can delay the
streams' tokens by a few decode steps in the same window (vLLM's does: seen once as a
second "step" of an unsplit prompt)."""


HELD_S = 0.25
"""A run whose loop woke later than this (ten decode steps and more; undisturbed runs here
woke 63 ms late at most) measured the machine holding the test's process, not the engine."""
RUN_ATTEMPTS = 3
"""Runs of one workload at most while each was disturbed (``until_undisturbed``)."""
T = TypeVar("T")


class LoopLag:
    """The test process's event loop, woken every ``TICK_S``: how late it woke at worst.

    The proxy under test runs on this loop: a loop late by ``worst_s`` read the engine's
    tokens as much late, in a burst, and the gaps it stamped then are the machine's (a
    process held by a busy host, or something on the loop that ran long), not the engine's."""

    TICK_S = 0.005

    def __init__(self) -> None:
        self.worst_s = 0.0
        """The worst lateness."""
        self.worst_at_s = 0.0
        """When it ended, seconds from the start."""
        self._tasks = TaskSet()
        self._t0 = 0.0

    async def _watch(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.TICK_S)
            now = time.perf_counter()
            late = now - t - self.TICK_S
            if late > self.worst_s:
                self.worst_s, self.worst_at_s = late, now - self._t0

    async def __aenter__(self) -> LoopLag:
        self._t0 = time.perf_counter()
        self._tasks.spawn(self._watch(), name="loop-lag")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._tasks.cancel_all()

    def line(self) -> str:
        """One line for the output."""
        return (
            f"the loop woke {self.worst_s * 1e3:.1f} ms late at worst "
            f"({self.worst_at_s:.1f} s into the run)"
        )


async def until_undisturbed(
    what: str, run: Callable[[], Awaitable[T]], disturbed: Callable[[T], Awaitable[str | None]]
) -> T:
    """``run()``, again while ``disturbed`` names what disturbed it, ``RUN_ATTEMPTS`` times at
    most (each retry said in the output; the last run is kept, and its checks judge it)."""
    for attempt in range(1, RUN_ATTEMPTS):
        result = await run()
        why = await disturbed(result)
        if why is None:
            return result
        print(f"\n{what}: {why}; run again (attempt {attempt + 1} of {RUN_ATTEMPTS})")
    return await run()


def held(late_s: float) -> str | None:
    """What disturbed a run whose loop woke more than ``HELD_S`` late, else ``None``."""
    if late_s <= HELD_S:
        return None
    return (
        f"the test's loop woke {late_s * 1e3:.0f} ms late (bound {HELD_S * 1e3:.0f}): its "
        "stamps measured the machine holding the process, not the engine"
    )


async def read_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], rid: str
) -> None:
    """One streamed chat completion through ``url``, read to its end, as request ``rid``.

    The client asks for usage: the advisor then fits on the backend's prompt counts (the
    proxy never asks llama.cpp for them), and the client reads what it reads."""
    body = {**body, "stream_options": {"include_usage": True}}
    headers = {"X-Request-Id": rid}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for _ in resp.content.iter_any():
            pass


async def decode_step_s(proxy: RecordedProxy, prompts: Prompts, rid: str) -> float:
    """One stream alone: its mean gap, in seconds (sizes a workload to this machine; not the
    median: an API server behind on a busy machine sends tokens in bursts, most gaps 0)."""
    async with aiohttp.ClientSession() as session:
        await read_stream(session, proxy.url, chat(prompts.text(24), 24), rid)
    stamps = proxy.watcher.output_ns[rid]
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1) / 1e9


@dataclass(frozen=True, slots=True)
class FitRun:
    """What the fit's workload saw of the machine."""

    step_s: float
    """One stream alone, just before (sizes the workload)."""
    loop_late_s: float
    """The test's loop woke this late at worst during it (``LoopLag``)."""


async def fit_workload(
    proxy: RecordedProxy,
    prompts: Prompts,
    long_prompts: Sequence[int],
    *,
    streams: int,
    prefill_s_per_token: float,
    most_tokens: int | None = None,
) -> FitRun:
    """What the advisor fits from: ``streams`` streams that end one after another (decode
    steps at ``streams`` down to 1), while the ``long_prompts`` come one at a time (requests
    ``fit-0`` .., ``fit-long-0`` ..).

    The streams outlast every prefill (``prefill_s_per_token`` sizes them, with this
    machine's one-stream step), then one fewer every 8 steps; ``most_tokens`` caps the first
    one's output (a KV cache that must hold them beside the prompts)."""
    step_s = await decode_step_s(proxy, prompts, "fit-probe")
    busy_s = sum(p * prefill_s_per_token + 12 * step_s for p in long_prompts)
    base = int(busy_s / step_s) + 30
    if most_tokens is not None:
        base = min(base, most_tokens)
    print(f"\nfit run: one-stream step {step_s * 1e3:.1f} ms, base {base} tokens")
    lag = LoopLag()
    async with lag, aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with asyncio.TaskGroup() as group:
            for i in range(streams):
                body = chat(prompts.text(24), base + 8 * i)
                group.create_task(read_stream(session, proxy.url, body, f"fit-{i}"))
            await asyncio.sleep(20 * step_s + 1.0)
            for k, tokens in enumerate(long_prompts):
                await read_stream(
                    session, proxy.url, chat(prompts.text(tokens), 2), f"fit-long-{k}"
                )
                await asyncio.sleep(10 * step_s)
    print(f"fit run: {lag.line()}")
    return FitRun(step_s, lag.worst_s)


def timeline(proxy: RecordedProxy) -> str:
    """Every request the proxy's watcher saw, a line each, ms from the first forward: forwarded,
    first output, finished, outputs, median and worst gap (what a fit lacking data was fed)."""
    w = proxy.watcher
    t0 = min(w.forwarded_ns.values(), default=0)
    lines = []
    for rid, tf in sorted(w.forwarded_ns.items(), key=lambda kv: kv[1]):
        stamps = w.output_ns.get(rid, [])
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        end = w.finished_ns.get(rid)
        lines.append(
            f"  {rid:12} forwarded {(tf - t0) / 1e6:9.1f}"
            f" first {(stamps[0] - t0) / 1e6 if stamps else float('nan'):9.1f}"
            f" finished {(end - t0) / 1e6 if end is not None else float('nan'):9.1f}"
            f" outputs {len(stamps):4d}"
            f" gap median {statistics.median(gaps) / 1e6 if gaps else float('nan'):7.1f}"
            f" worst {max(gaps, default=0) / 1e6:7.1f}"
        )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class WindowCells:
    """A long request's prefill window as the streams decoding through it saw it (each the
    median over the streams: one stream's bad luck with a shared machine's scheduler is not
    the engine's)."""

    worst_gap_s: float
    """Each stream's worst gap that ended in the window."""
    rate_per_s: float
    """Each stream's tokens per second over the gaps that carried the prompt."""
    steps: int
    """Each stream's gaps that carried the prompt."""
    stalls: int
    """Each stream's stalls the proxy attributed to the long request."""
    decode_step_s: float
    """The streams' gaps outside the window (all streams' together)."""


def window_cells(proxy: RecordedProxy, long_rid: str, stream_rids: Sequence[str]) -> WindowCells:
    """The cells of ``long_rid``'s window ``(forwarded, first token]`` in ``stream_rids``: the
    gaps that ended in it (the step that made the first token: up to half a step later, the
    sockets are read one after another)."""
    tf = proxy.watcher.forwarded_ns[long_rid]
    t1 = proxy.watcher.output_ns[long_rid][0]
    caused = proxy.sink.stalls_caused_by(long_rid)
    worsts, rates, steps, stalls, outside = [], [], [], [], []
    for rid in stream_rids:
        stamps = proxy.watcher.output_ns[rid]
        gaps = list(itertools.pairwise(stamps))
        assert stamps[0] < tf, f"{rid} started after {long_rid}"
        assert stamps[-1] > t1, f"{rid} did not outlast the prefill of {long_rid}"
        typical = statistics.median(b - a for a, b in gaps)
        window = [b - a for a, b in gaps if tf < b <= t1 + typical / 2]
        carried = [g for g in window if g > max(ELEVATED * typical, PIECE_SHARE * max(window))]
        outside += [b - a for a, b in gaps if b < tf or a > t1 + typical]
        worsts.append(max(window))
        rates.append(len(carried) / (sum(carried) / 1e9) if carried else 0.0)
        steps.append(len(carried))
        stalls.append(len([s for s in caused if s.request_id == rid]))
    return WindowCells(
        worst_gap_s=statistics.median(worsts) / 1e9,
        rate_per_s=statistics.median(rates),
        steps=round(statistics.median(steps)),
        stalls=round(statistics.median(stalls)),
        decode_step_s=statistics.median(outside) / 1e9,
    )


@dataclass(frozen=True, slots=True)
class Measured:
    """One engine setting's measured run: what the streams and the new request saw."""

    budget: int
    """The engine's knob in this run (vLLM's ``--max-num-batched-tokens``, llama.cpp's
    ``n_batch``)."""
    prompt_tokens: int
    """The long request's prompt (the engine's usage: the text and the chat template)."""
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
    """The engine's own prefill time of the long request, where it reports one (vLLM's
    per-request metrics: scheduled to first token)."""
    decode_step_s: float
    """Median gap of the streams outside the window."""
    probe_step_s: float
    """One stream alone, just before: how fast the machine was for this run."""
    loop_late_s: float
    """The test's loop woke this late at worst during the run (``LoopLag``)."""


async def measured_run(
    proxy: RecordedProxy,
    prompts: Prompts,
    budget: int,
    *,
    streams: int,
    long_prompt: int,
    stream_tokens: Callable[[float], int],
) -> Measured:
    """``streams`` streams, then one ``long_prompt``-token prompt: every cell of the advisor's
    row as the proxy measured it (``stream_tokens(one-stream step)``: each stream's output,
    enough for it to outlast the prefill)."""
    step_s = await decode_step_s(proxy, prompts, "m-probe")
    text = prompts.text(long_prompt)
    lag = LoopLag()
    async with lag, aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with asyncio.TaskGroup() as group:
            for i in range(streams):
                body = chat(prompts.text(24), stream_tokens(step_s))
                group.create_task(read_stream(session, proxy.url, body, f"m-{i}"))
            await asyncio.sleep(20 * step_s + 1.0)
            await read_stream(session, proxy.url, chat(text, 2), "m-long")
    proxy.settle()
    cells = window_cells(proxy, "m-long", [f"m-{i}" for i in range(streams)])
    record = proxy.sink.requests["m-long"]
    assert record.prompt_tokens is not None, "the engine sent no usage"
    assert prompts.count(text) <= record.prompt_tokens < prompts.count(text) + 32  # + template
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
        probe_step_s=step_s,
        loop_late_s=lag.worst_s,
    )


async def undisturbed_fit(
    what: str,
    new_proxy: Callable[[], Awaitable[RecordedProxy]],
    prompts: Prompts,
    long_prompts: Sequence[int],
    *,
    streams: int,
    prefill_s_per_token: float,
    most_tokens: int | None = None,
    held_outside: Callable[[RecordedProxy], str | None] | None = None,
) -> tuple[RecordedProxy, FitRun]:
    """``fit_workload`` through a new proxy, again while its loop was held, the fit, asked for
    the longest prompt, lacks data (the workload gives it all of it on an undisturbed run), or
    ``held_outside`` says what held a request outside the engine (its own timings tell)."""

    async def run() -> tuple[RecordedProxy, FitRun]:
        proxy = await new_proxy()
        fit_run = await fit_workload(
            proxy, prompts, long_prompts, streams=streams,
            prefill_s_per_token=prefill_s_per_token, most_tokens=most_tokens,
        )  # fmt: skip
        return proxy, fit_run

    async def disturbed(done: tuple[RecordedProxy, FitRun]) -> str | None:
        proxy, fit_run = done
        backend = await advice(proxy.admin_url, max(long_prompts), streams, "none")
        if backend["status"] != "ok":
            late = held(fit_run.loop_late_s) or "the loop was not held"
            return f"the fit lacks {backend['missing']} ({late})\n{timeline(proxy)}"
        outside = held_outside(proxy) if held_outside is not None else None
        return held(fit_run.loop_late_s) or outside

    return await until_undisturbed(what, run, disturbed)


async def undisturbed_measured(
    what: str,
    new_proxy: Callable[[], Awaitable[RecordedProxy]],
    measure: Callable[[RecordedProxy], Awaitable[Measured]],
) -> Measured:
    """``measure`` (a ``measured_run``) through a new proxy, again while its loop was held or
    its streams' tokens came in bursts: eight streams' typical gap under half of one stream's
    step is tokens held back and sent together (by the engine's API server or the machine),
    not steps."""

    async def run() -> Measured:
        return await measure(await new_proxy())

    async def disturbed(m: Measured) -> str | None:
        if m.decode_step_s < m.probe_step_s / 2:
            return (
                f"the streams' typical gap outside the window, {m.decode_step_s * 1e3:.1f} ms, "
                f"is under half of one stream's step, {m.probe_step_s * 1e3:.1f} ms: their "
                "tokens came in bursts"
            )
        return held(m.loop_late_s)

    return await until_undisturbed(what, run, disturbed)


async def advice(admin_url: str, prompt_tokens: int, streams: int, chunk: str) -> dict[str, Any]:
    """The one backend's ``/advice`` for ``chunk`` (``none``: unchunked)."""
    query = {"prompt_tokens": str(prompt_tokens), "streams": str(streams), "chunk_sizes": chunk}
    async with aiohttp.ClientSession() as session:
        async with session.get(admin_url + "/advice", params=query) as resp:
            data: dict[str, Any] = await resp.json()
    (backend,) = data["backends"]
    assert isinstance(backend, dict)
    return backend


@dataclass(frozen=True, slots=True)
class Direction:
    """A fit at one setting of the engine's knob against the other setting's measured run."""

    knob: str
    """The knob, as the table names it (``--max-num-batched-tokens``, ``n_batch``)."""
    fit_budget: int
    streams: int
    """Streams decoding through the measured prefill."""
    backend: dict[str, Any]
    """The ``/advice`` answer for the measured run's row."""
    measured: Measured
    fit_run: FitRun
    """One stream alone before the fit workload (beside ``measured.probe_step_s``: how far
    the machine's speed moved between the two), and how late the loop woke in it."""

    @property
    def fit(self) -> dict[str, Any]:
        """The fitted model, as ``/advice`` gives it."""
        fit: dict[str, Any] = self.backend["fit"]
        return fit

    @property
    def row(self) -> dict[str, Any]:
        """The predicted row."""
        (row,) = self.backend["table"]
        assert isinstance(row, dict)
        return row

    @property
    def steps(self) -> int:
        """Steps the advisor splits the prompt into at the measured setting: each one a stall
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
            window = row["ttft_s"] - (d["base"] + d["per_stream"] * self.streams) / 2
            cells.append(("engine's own prefill (ms)", window * 1e3, m.engine_prefill_s * 1e3))
        return cells

    def errors(self) -> list[float]:
        """Each timed cell's error, predicted over measured minus 1, in ``cells`` order."""
        return [p / v - 1 for _, p, v in self.cells()]

    def table(self) -> str:
        """The validation table: fitted, then predicted against measured."""
        fit, m = self.fit, self.measured
        d = fit["decode_step_s"]
        obs = fit["observations"]
        chunk = f"chunk {fit['chunk_size']}" if fit["chunked"] else "prompts unchunked"
        lines = [
            f"{self.backend['engine']['name']} fitted at {self.knob} {self.fit_budget} -> "
            f"measured at {m.budget}: {m.prompt_tokens}-token prompt, {self.streams} streams "
            f"decoding; one-stream step {self.fit_run.step_s * 1e3:.1f} ms before the fit, "
            f"{m.probe_step_s * 1e3:.1f} ms before the measured run; the test's loop woke "
            f"{self.fit_run.loop_late_s * 1e3:.0f} and {m.loop_late_s * 1e3:.0f} ms late at "
            "worst in them",
            f"  fitted: decode {d['base'] * 1e3:.1f} ms + {d['per_stream'] * 1e3:.2f} ms x "
            f"streams, prefill {fit['prefill_tokens_per_s']:.0f} tokens/s, "
            f"{fit['prefill_step_s'] * 1e3:.0f} ms a prefill step, "
            f"{fit['prefill_context_s'] * 1e9:.0f} ns more a token per token of context, {chunk}",
            *(f"  {obs[k]}" for k in ("prefill_step_note", "prefill_context_note") if obs.get(k)),
            f"  range seen {fit['range']}; extrapolation: {self.row['extrapolation'] or 'none'}",
            f"  measured decode step outside the window {m.decode_step_s * 1e3:.1f} ms",
            f"  {'cell':32} {'predicted':>10} {'measured':>10} {'error':>7}",
        ]
        for name, p, v in self.cells():
            lines.append(
                f"  {name:32} {p:10.{2 if p < 100 else 0}f} {v:10.{2 if v < 100 else 0}f} "
                f"{p / v - 1:+7.1%}"
            )
        lines.append(f"  {'stalls per stream':32} {self.steps:10d} {m.stalls:10d}")
        lines.append(f"  {'steps that carried the prompt':32} {self.steps:10d} {m.steps:10d}")
        return "\n".join(lines)

    def failures(self, tolerance: float) -> list[str]:
        """Every timed cell outside ``tolerance`` (relative, both ways) and stalls that differ,
        one line each."""
        out = [
            f"fit at {self.fit_budget}, {name}: predicted {p:.1f}, measured {v:.1f} "
            f"({p / v - 1:+.1%}, bound {tolerance:.0%})"
            for name, p, v in self.cells()
            if abs(p - v) > tolerance * v
        ]
        if self.steps != self.measured.stalls:
            out.append(f"fit at {self.fit_budget}: stalls {self.steps} predicted, "
                       f"{self.measured.stalls} measured")  # fmt: skip
        late_s = max(self.fit_run.loop_late_s, self.measured.loop_late_s)
        if out and late_s > HELD_S:
            out.append(f"fit at {self.fit_budget}: the test's loop woke {late_s * 1e3:.0f} ms "
                       f"late (bound {HELD_S * 1e3:.0f}) in the run kept, the last: the cells "
                       "above measured the machine holding the process too")  # fmt: skip
        return out


DUMP_ENV = "TOKENSTAMP_ADVISOR_DUMP"
"""A folder: each direction's fit observations and measured run are pickled there, to replay
the fit offline (``pickle.load`` gives ``(ObservationSnapshot, Direction)``; ``fit(snapshot)``
then gives the model again) while changing it."""


def keep_for_replay(fit_proxy: RecordedProxy, direction: Direction) -> None:
    """With ``TOKENSTAMP_ADVISOR_DUMP`` set, pickle the fit's observations and ``direction``."""
    folder = os.environ.get(DUMP_ENV)
    advisor = fit_proxy.running.advisor
    if not folder or advisor is None:
        return
    (observations,) = advisor.observations
    name = direction.backend["engine"]["name"] or "engine"
    path = Path(folder) / f"{name}-{direction.fit_budget}-{time.strftime('%Y%m%dT%H%M%S')}.pkl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps((observations.snapshot(), direction)))
    print(f"kept for replay: {path}")
