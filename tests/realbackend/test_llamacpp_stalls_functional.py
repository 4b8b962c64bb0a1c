"""llama.cpp's server behind tokenstamp: timing agrees with the client, stalls are found.

Eight greedy streams decode; one random ~2,000-token prompt arrives. With
``n_batch`` 2048 llama.cpp computes the whole prompt in one step, mixed with
one decode token of every running stream: every stream freezes once, for the
whole prefill, and the long request's first token comes out with their next
token. With ``n_batch`` 512 the prompt is computed in about four pieces, each
one step: every stream freezes about four times, shorter, all before the long
request's first token.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporters import names
from proxy.core.records import StallCause
from tests.realbackend.client import Prompts
from tests.realbackend.llamacpp_server import LlamaCppServer
from tests.realbackend.recorder import ProxyFactory, RecordedProxy
from tests.realbackend.scrape import scrape
from tests.realbackend.workload import StutterRun, agreement, stutter_run

pytestmark = [pytest.mark.realbackend, pytest.mark.timeout(180)]

STREAMS = 8
# Tokens per stream: ~1,000 gaps in all, so one scheduler hiccup of the machine
# (it freezes the few streams of one step) stays inside the 1% a p99 leaves.
STREAM_TOKENS = 130
TOLERANCE_S = 0.001  # the bar: proxy and client agree within 1 ms at p99
# A client's TTFT also holds what happens before the proxy's t0, stamped once
# the head and body are read (DESIGN.md): accept, HTTP parsing, the body read,
# a turn of the event loop behind the other streams' tokens. Measured 0.5-3 ms
# on 2 shared cores (see README.md here); checked apart, with its own bound.
# The first request of a run also pays the proxy's accept and cold handler path
# before t0 (seen: 6.4 ms once on a quiet machine); later ones 1-2 ms.
INGEST_TOLERANCE_S = 0.010
LOOSE_TOLERANCE_S = 0.015  # the bound when it was (a few scheduler time slices)


def _check_agreement(proxy: RecordedProxy, run: StutterRun) -> None:
    """Every event the client saw, the proxy stamped first, and they agree on every interval.

    The bound is the issue's 1 ms at p99, per event (the first token's too) and
    per gap; the part of TTFT before ``t0`` has ``INGEST_TOLERANCE_S``. It is a property of the proxy only while neither
    process waits for a CPU: both measuring loops run boosted (``sched.Boost``),
    and if they still waited (no privileges, see ``Contention``) a descheduled
    client adds its wait to its own stamps, so then only a loose bound is
    checked and the output says so.
    """
    agree = agreement(proxy, [*run.streams, run.long])
    print("\nproxy vs client, same requests, same clock:\n" + agree.table())
    print(run.contention.line())
    assert not agree.mismatched, agree.mismatched
    assert min(agree.seen_lags_s) >= 0, "the client cannot see a token before the proxy read it"
    assert abs(statistics.median(agree.gap_diffs_s)) <= 0.1 * TOLERANCE_S, agree.table()
    bound = TOLERANCE_S
    if not run.contention.quiet:
        bound = LOOSE_TOLERANCE_S
        print(f"machine oversubscribed: checking p99 <= {bound * 1e3:g} ms, not 1 ms")
    assert agree.p99(agree.event_lags_s) <= bound, agree.table()
    assert agree.p99(agree.gap_diffs_s) <= bound, agree.table()
    # TTFT = the first token's event lag (checked above) + the time before t0.
    # The client stamps "sent" after its write returns: descheduled in between, its
    # stamp is late by the wait, so only a quiet machine holds it to causality exactly.
    floor = 0.0 if run.contention.quiet else -bound
    assert min(agree.ingest_s) >= floor, "the proxy cannot read a request before it was sent"
    ingest_bound = INGEST_TOLERANCE_S if run.contention.quiet else LOOSE_TOLERANCE_S
    assert agree.p99(agree.ingest_s) <= ingest_bound, agree.table()


def _check_streams_complete(run: StutterRun, tokens: int) -> None:
    for cap in run.streams:
        assert cap.status == 200, cap.body[:300]
        assert not cap.error
        assert len(cap.output_ns) == tokens, f"{cap.request_id}: {len(cap.output_ns)} tokens"
    assert run.long.status == 200
    assert run.long.output_ns, "the long request produced no output"


@dataclass
class LiveTtft:
    """One scrape of ``/metrics`` taken while the short streams decode."""

    ttft_count: float
    """``gen_ai_server_time_to_first_token_seconds_count`` then."""
    ttft_sum_s: float
    """Its ``_sum``."""
    started: list[str]
    """Short streams whose first token the proxy had reported by then."""
    finished: list[str]
    """Requests that had finished by then."""


async def _scrape_when_streams_started(proxy: RecordedProxy, tag: str) -> LiveTtft:
    """Once every short stream has its first token, and before any ends: one scrape."""
    prefix = f"{tag}-stream-"
    for _ in range(6000):  # bounded: 60 s
        if sum(1 for rid in proxy.sink.first_tokens if rid.startswith(prefix)) >= STREAMS:
            break
        await asyncio.sleep(0.01)  # reads a dict: nothing for the proxy's loop to do
    else:
        raise AssertionError(f"short streams never all started: {sorted(proxy.sink.first_tokens)}")
    started = sorted(rid for rid in proxy.sink.first_tokens if rid.startswith(prefix))
    samples = await scrape(proxy.admin_url + "/metrics")
    return LiveTtft(
        samples.sum(names.TTFT.prom_name + "_count"),
        samples.sum(names.TTFT.prom_name + "_sum"),
        started,
        sorted(proxy.sink.requests),
    )


async def _live_stutter_run(
    proxy: RecordedProxy, prompts: Prompts, tag: str
) -> tuple[StutterRun, LiveTtft]:
    """The stutter workload, with ``/metrics`` scraped while the short streams decode.

    The short streams ask for usage themselves: with ``--provider llama.cpp`` the proxy
    does not ask, and tokens per event needs the completion-token count."""
    async with asyncio.TaskGroup() as tg:
        live = tg.create_task(_scrape_when_streams_started(proxy, tag))
        run = await stutter_run(
            proxy, prompts, streams=STREAMS, stream_tokens=STREAM_TOKENS, tag=tag, usage=True
        )
    return run, live.result()


def _check_live_ttft(proxy: RecordedProxy, run: StutterRun, live: LiveTtft) -> None:
    """TTFT reached ``/metrics`` at each first token, not at each end; once per request."""
    short = [cap.request_id for cap in run.streams]
    print(f"mid-stream scrape: {live.ttft_count:g} TTFTs, {len(live.finished)} requests finished")
    assert live.started == sorted(short)
    assert not set(short) & set(live.finished), "a stream ended before the scrape"
    assert live.ttft_count >= STREAMS
    live_sum = sum(proxy.sink.first_tokens[rid] for rid in short)
    assert live.ttft_sum_s >= live_sum - 1e-6
    for cap in [*run.streams, run.long]:
        record = proxy.sink.requests[cap.request_id]
        # The live observation is the record's TTFT: the same two stamps.
        assert proxy.sink.first_tokens[cap.request_id] == record.ttft_s
    for cap in run.streams:
        record = proxy.sink.requests[cap.request_id]
        # llama.cpp sends one token per event: tokens per event is exactly 1.
        assert record.completion_tokens == STREAM_TOKENS, record
        assert record.tokens_per_event == 1.0


async def _check_metrics_after(proxy: RecordedProxy) -> None:
    samples = await scrape(proxy.admin_url + "/metrics")
    requests = STREAMS + 1
    assert samples.sum(names.TTFT.prom_name + "_count") == requests
    assert samples.sum(names.PREFIX_CACHE_TTFT.prom_name + "_count") == requests
    # The same observations, summed in another order (first tokens, then ends by label).
    assert samples.sum(names.TTFT.prom_name + "_sum") == pytest.approx(
        samples.sum(names.PREFIX_CACHE_TTFT.prom_name + "_sum")
    )
    per_event = names.TOKENS_PER_EVENT.prom_name
    assert samples.sum(per_event + "_count") == STREAMS  # the long request asked no usage
    assert samples.sum(per_event + "_sum") == STREAMS  # 1.0 each
    assert samples.sum(names.ACCEPTANCE_LENGTH.prom_name + "_count") == 0


async def _check_stall_metrics(proxy: RecordedProxy, prefill_stalls: int) -> None:
    samples = await scrape(proxy.admin_url + "/metrics")
    cause = names.label_name(names.STALL_CAUSE)
    assert samples.sum(names.STALLS.prom_series, **{cause: "prefill"}) >= prefill_stalls
    assert samples.sum(names.STALL_DURATION.prom_name + "_count") == len(proxy.sink.stalls)


async def test_unchunked_prefill_stalls_every_stream_once(
    llamacpp: LlamaCppServer,
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tokenstamp.stalls")
    proxy = await recorded_proxy(llamacpp.url, provider="llama.cpp")
    run, live = await _live_stutter_run(proxy, Prompts(tokenizer_json, "unchunked"), "u")
    proxy.settle()
    _check_streams_complete(run, STREAM_TOKENS)
    _check_agreement(proxy, run)
    _check_live_ttft(proxy, run, live)
    await _check_metrics_after(proxy)

    long_id = run.long.request_id
    window = proxy.sink.prefills[long_id]
    print(
        f"long prompt: {run.long_prompt_tokens} tokens, prefill window {window.window_s:.3f} s, "
        f"stalled {window.stalled_streams} streams, stutter cost {window.stutter_cost_s:.2f} s"
    )
    # A process that waited for a CPU stamps late by as long: a busy machine's slack.
    slack_ns = 0 if run.contention.quiet else round(LOOSE_TOLERANCE_S * 1e9)
    ms = 1e6
    for cap in run.streams:
        mine = [s for s in proxy.sink.stalls_of(cap.request_id) if long_id in s.culprits]
        assert len(mine) == 1, f"{cap.request_id}: {proxy.sink.stalls_of(cap.request_id)}"
        stall = mine[0]
        print(
            f"  {cap.request_id}: frozen from {(stall.start_ns - window.forwarded_ns) / ms:+.1f} ms"
            f" after the prompt was forwarded (baseline {stall.baseline_ns / ms:.1f} ms) to "
            f"{(stall.end_ns - window.first_token_ns) / ms:+.1f} ms from its first token"
        )
        assert stall.cause is StallCause.PREFILL
        assert stall.culprits == (long_id,), stall
        # Unchunked: the freeze is the whole prefill. It starts with the stream's token
        # of the step running when the prompt arrived (or of the next one, if llama.cpp
        # took the request in after that step began): within two steps...
        assert stall.start_ns <= window.forwarded_ns + stall.baseline_ns * 2 + slack_ns, stall
        # ...and ends with the culprit's first token: one step carries both. llama.cpp
        # sends a step's tokens slot by slot, the streams' up to ~9 ms before or after
        # the first token (measured), while the next step's would come a whole step
        # later: "the same step" is within half a step.
        same_step_ns = stall.baseline_ns // 2
        assert abs(stall.end_ns - window.first_token_ns) <= same_step_ns + slack_ns, stall
    assert window.stalled_streams == STREAMS
    assert window.stalls == STREAMS
    assert any(
        "prefill stutter" in r.getMessage()
        and f"request_id={long_id}" in r.getMessage()
        and f"streams_stalled={STREAMS}" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    await _check_stall_metrics(proxy, STREAMS)


async def test_chunked_prefill_stalls_every_stream_several_times(
    llamacpp_factory: Callable[..., LlamaCppServer],
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
) -> None:
    server = llamacpp_factory(n_batch=512)
    proxy = await recorded_proxy(server.url, provider="llama.cpp")
    run, live = await _live_stutter_run(proxy, Prompts(tokenizer_json, "chunked"), "c")
    proxy.settle()
    _check_streams_complete(run, STREAM_TOKENS)
    _check_agreement(proxy, run)
    _check_live_ttft(proxy, run, live)

    long_id = run.long.request_id
    window = proxy.sink.prefills[long_id]
    pieces = -(-run.long_prompt_tokens // (512 - STREAMS))
    print(
        f"long prompt: {run.long_prompt_tokens} tokens in about {pieces} pieces, prefill window "
        f"{window.window_s:.3f} s, {window.stalls} stalls on {window.stalled_streams} streams"
    )
    for cap in run.streams:
        mine = proxy.sink.stalls_caused_by(long_id)
        mine = [s for s in mine if s.request_id == cap.request_id]
        durations = [round(s.duration_s, 3) for s in mine]
        assert len(mine) >= 2, f"{cap.request_id}: {proxy.sink.stalls_of(cap.request_id)}"
        for stall in mine:
            # Every piece's stall lies inside the long request's prefill window (the
            # last one ends in the step of its first token: within half a step of it).
            assert stall.start_ns >= window.forwarded_ns - stall.baseline_ns * 2, stall
            assert stall.end_ns <= window.first_token_ns + stall.baseline_ns // 2, stall
        print(f"  {cap.request_id}: stalls {durations} s")
    assert window.stalled_streams == STREAMS
    assert window.stalls >= 2 * STREAMS
    await _check_stall_metrics(proxy, 2 * STREAMS)
