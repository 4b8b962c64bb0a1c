"""vLLM behind tokenstamp: after a fixed workload, tokenstamp's /metrics against vLLM's own.

Workload: requests one at a time (so each one's TTFT can be read off vLLM's
histogram sum), then eight concurrent streams and one long prompt. Then both
``/metrics`` pages are scraped and set side by side:

* finished requests: equal;
* tokens in and out: equal (tokenstamp takes them from the usage it asks for);
* TTFT of each sequential request: never below vLLM's (vLLM's clock starts after
  the proxy's and stops before the proxy reads the token), above it by at most
  ``TTFT_SLACK_S`` at the median (a direct client sees the same excess: it is
  vLLM's own request parsing and response writing, outside vLLM's clock);
* inter-token gaps: the histogram bucket by bucket, at the bounds both have.
  vLLM stamps a token in its output loop, tokenstamp on the wire, after vLLM's
  frontend has serialised and written it; that delivery jitters by a few ms
  (``JITTER_S``), so a gap that close to a bound may land on either side of it.
  Allowed per bound: tokenstamp's gaps within ``JITTER_S`` of it, plus
  ``SLACK_SHARE`` of all gaps. When vLLM's API process falls behind it merges
  tokens into one event, so tokenstamp may see fewer, longer gaps (bounded by
  ``MERGED_SHARE``);
* tokens per output event: 1 (no speculative decoding), up to those merges;
* the engine's own timings of each sequential request, when the installed vLLM has
  ``--enable-per-request-metrics`` (the server is started with it then): the queue
  time and prefill in the final usage chunk's ``metrics`` equal what vLLM observed in
  ``vllm:request_queue_time_seconds`` and ``vllm:request_prefill_time_seconds`` for
  that request. Without the flag the test says so and checks that no timings came.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from exporters import names
from tests.realbackend.client import Prompts, chat, session, stream
from tests.realbackend.recorder import ProxyFactory, RecordedProxy
from tests.realbackend.sched import Boost, WaitMeter
from tests.realbackend.scrape import Samples, common_bounds, scrape
from tests.realbackend.vllm_server import VllmServer
from tests.realbackend.workload import stutter_run

pytestmark = [pytest.mark.realbackend, pytest.mark.vllm, pytest.mark.timeout(600)]

TTFT_SLACK_S = 0.025  # median excess over vLLM's TTFT (measured 4-16 ms on 2 shared cores)
LOOSE_TTFT_SLACK_S = 0.25  # ...when the machine is oversubscribed (vLLM's frontend waits)
PROXY_FORWARD_NS = 5_000_000  # arrival to forwarded, inside the proxy
FIRST_FORWARD_NS = 10_000_000  # ...for the proxy's first observed request (a cold path)
JITTER_S = 0.010  # how far vLLM's frontend may move a token on the wire (2 shared cores)
SLACK_SHARE = 0.03
MERGED_SHARE = 0.05
STREAMS = 4
SEQUENTIAL_PROMPTS = (16, 64, 256, 512, 1024, 128)
ENGINE_TIMING_TOLERANCE_S = 0.001  # one engine's two reports of one request (ms in JSON)
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_QUEUE = "vllm:request_queue_time_seconds"
VLLM_PREFILL = "vllm:request_prefill_time_seconds"


async def _vllm_next(vllm: VllmServer, before: Samples) -> tuple[dict[str, float], Samples]:
    """Wait for vLLM to count one more request; its TTFT, queue and prefill time, the scrape.

    vLLM observes TTFT at the first token and the queue and prefill times when the
    request finishes: wait for all three counts to move."""
    for _ in range(400):  # bounded: about 20 s
        now = await scrape(vllm.url + "/metrics")
        names_ = (VLLM_TTFT, VLLM_QUEUE, VLLM_PREFILL)
        if all(now.sum(n + "_count") > before.sum(n + "_count") for n in names_):
            return {n: now.sum(n + "_sum") - before.sum(n + "_sum") for n in names_}, now
        await asyncio.sleep(0.05)
    raise AssertionError("vLLM never counted the request")


def _row(name: str, ours: float, theirs: float, unit: str = "") -> str:
    return f"  {name:44} {ours:14.4f} {theirs:14.4f} {ours - theirs:+12.4f} {unit}"


async def test_metrics_agree_with_vllm(
    vllm: VllmServer, recorded_proxy: ProxyFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy: RecordedProxy = await recorded_proxy(vllm.url, provider="vllm")
    prompts = Prompts(vllm.model / "tokenizer.json", "vllm")
    # 0. Each size asked directly (before the counted part): what vLLM's own client
    # sees beyond vLLM's TTFT - vLLM starts its clock after parsing the request and
    # stops it before the token is serialised and written.
    direct_rows = []
    before = await scrape(vllm.url + "/metrics")
    async with session() as http:
        for i, size in enumerate(SEQUENTIAL_PROMPTS):
            cap = await stream(http, vllm.url, chat(prompts.text(size), 16), f"direct-{i}")
            seen, before = await _vllm_next(vllm, before)
            direct_rows.append((f"direct-{i}", size, cap.ttft_s, seen[VLLM_TTFT]))
    await asyncio.sleep(0.5)
    v0 = await scrape(vllm.url + "/metrics")
    t0 = time.monotonic()

    # 1. One at a time through the proxy: each request's TTFT on both sides. First one
    # request vLLM does not count, so that the proxy holds a pooled connection: a first
    # request's "forwarded" also holds vLLM's accept of a new connection (5-6 ms with
    # its API server busy), which is not the proxy's part.
    async with session() as http, http.get(proxy.url + "/v1/models") as warm:
        assert warm.status == 200, await warm.text()
        await warm.read()
    ttft_rows = []
    engine_rows: list[tuple[str, dict[str, float]]] = []
    before = v0
    assert vllm.proc is not None
    with Boost(), WaitMeter(proxy="self", vllm=vllm.proc.pid) as meter:
        async with session() as http:
            for i, size in enumerate(SEQUENTIAL_PROMPTS):
                rid = f"seq-{i}"
                cap = await stream(http, proxy.url, chat(prompts.text(size), 16), rid)
                assert cap.status == 200, cap.body[:300]
                seen, before = await _vllm_next(vllm, before)
                ours = proxy.sink.requests[rid].ttft_s
                assert ours is not None
                ttft_rows.append((rid, size, ours, seen[VLLM_TTFT]))
                engine_rows.append((rid, seen))

    # 2. A few streams and a long prompt, concurrently.
    run = await stutter_run(proxy, prompts, streams=STREAMS, stream_tokens=48, long_tokens=1500,
                            warm_events=8, tag="v", watch={"vllm": vllm.proc.pid})  # fmt: skip
    assert all(c.status == 200 and not c.error for c in [*run.streams, run.long])
    workload_s = time.monotonic() - t0
    await asyncio.sleep(0.5)
    theirs_all = (await scrape(vllm.url + "/metrics")).minus(v0)
    ours_all = await scrape(proxy.admin_url + "/metrics")

    # Side by side.
    out_label = {names.label_name(names.TOKEN_TYPE): "output"}
    in_label = {names.label_name(names.TOKEN_TYPE): "input"}
    usage = names.TOKEN_USAGE.prom_name
    rows = {
        "finished requests": (
            ours_all.sum(names.REQUESTS.prom_series, **{names.label_name(names.OUTCOME): "ok"}),
            theirs_all.sum("vllm:request_success_total"),
        ),
        "output tokens": (
            ours_all.sum(usage + "_sum", **out_label),
            theirs_all.sum("vllm:generation_tokens_total"),
        ),
        "prompt tokens": (
            ours_all.sum(usage + "_sum", **in_label),
            theirs_all.sum("vllm:prompt_tokens_total"),
        ),
        "TTFT count": (
            ours_all.sum(names.TTFT.prom_name + "_count"),
            theirs_all.sum("vllm:time_to_first_token_seconds_count"),
        ),
        "TTFT sum (s)": (
            ours_all.sum(names.TTFT.prom_name + "_sum"),
            theirs_all.sum("vllm:time_to_first_token_seconds_sum"),
        ),
        "gap count": (
            ours_all.sum(names.GAP.prom_name + "_count"),
            theirs_all.sum("vllm:inter_token_latency_seconds_count"),
        ),
        "gap sum (s)": (
            ours_all.sum(names.GAP.prom_name + "_sum"),
            theirs_all.sum("vllm:inter_token_latency_seconds_sum"),
        ),
    }
    ours_gaps = ours_all.buckets(names.GAP.prom_name)
    theirs_gaps = theirs_all.buckets("vllm:inter_token_latency_seconds")
    n_ours, n_theirs = rows["gap count"]
    lines = [
        f"\nworkload {workload_s:.1f} s; vLLM started in {vllm.started_s:.1f} s",
        f"  {'':44} {'tokenstamp':>14} {'vLLM':>14} {'difference':>12}",
    ]
    lines += [_row(k, a, b) for k, (a, b) in rows.items()]
    lines.append("  TTFT per sequential request (ms):")
    for rid, size, o, t in ttft_rows:
        rec = proxy.sink.requests[rid]
        fwd_ms = ((rec.forwarded_ns or 0) - rec.arrival_ns) / 1e6
        lines.append(_row(f"{rid} ({size} prompt tokens)", o * 1e3, t * 1e3,
                          f"ms (proxy forwarded after {fwd_ms:.2f} ms)"))  # fmt: skip
    lines.append("  the same sizes asked directly, a client's TTFT against vLLM's (ms):")
    lines += [_row(f"{rid} ({size} prompt tokens)", o * 1e3, t * 1e3, "ms")
              for rid, size, o, t in direct_rows]  # fmt: skip
    lines.append(
        f"  inter-token gaps at or below each bound (allowed: tokenstamp's gaps within "
        f"{JITTER_S * 1e3:g} ms of the bound + {SLACK_SHARE:.0%} of all):"
    )
    raw = [g for gaps in proxy.sink.gaps.values() for g in gaps]
    checks = []
    for le in common_bounds(ours_gaps, theirs_gaps):
        near = sum(1 for g in raw if abs(g - le) <= JITTER_S)
        allowed = near + SLACK_SHARE * n_theirs
        checks.append((le, ours_gaps[le], theirs_gaps[le], allowed))
        lines.append(_row(f"le {le:g} s (allowed {allowed:.0f})", ours_gaps[le], theirs_gaps[le]))
    if vllm.per_request_metrics:
        lines.append(
            "  the engine's own timings, per-request metrics against vLLM's histograms (ms):"
        )
        for rid, seen in engine_rows:
            t = proxy.sink.requests[rid].backend_timings
            lines.append(_row(f"{rid} queue", (t.queue_s or 0) * 1e3 if t else 0,
                              seen[VLLM_QUEUE] * 1e3, "ms"))  # fmt: skip
            lines.append(_row(f"{rid} prefill", (t.prefill_s or 0) * 1e3 if t else 0,
                              seen[VLLM_PREFILL] * 1e3, "ms"))  # fmt: skip
    else:
        lines.append(f"  vLLM {vllm.version} has no --enable-per-request-metrics: the engine's "
                     "queue time is not in its answers, so it is not compared")  # fmt: skip
    per_event = [r.tokens_per_event for r in proxy.sink.requests.values()]
    per_event_known = [v for v in per_event if v is not None]
    lines.append(f"  tokens per output event: median {statistics.median(per_event_known):.3f}, "
                 f"max {max(per_event_known):.3f} over {len(per_event_known)} streams")  # fmt: skip
    lines.append("  sequential phase: " + meter.result.line())
    lines.append("  concurrent phase: " + run.contention.line())
    with capsys.disabled():
        print("\n".join(lines))

    ok_ours, ok_theirs = rows["finished requests"]
    assert ok_ours == ok_theirs == len(SEQUENTIAL_PROMPTS) + STREAMS + 1
    assert rows["output tokens"][0] == rows["output tokens"][1]
    assert rows["prompt tokens"][0] == rows["prompt tokens"][1]
    assert rows["TTFT count"][0] == rows["TTFT count"][1]
    assert rows["TTFT sum (s)"][0] >= rows["TTFT sum (s)"][1]
    excess = [ours - theirs for _rid, _size, ours, theirs in ttft_rows]
    slack = TTFT_SLACK_S if meter.result.quiet else LOOSE_TTFT_SLACK_S
    for rid, _size, ours, theirs in ttft_rows:
        assert ours >= theirs, f"{rid}: tokenstamp {ours} s below vLLM's {theirs} s"
        # The proxy's own part of the excess: arrival to forwarded.
        rec = proxy.sink.requests[rid]
        assert rec.forwarded_ns is not None
        # The first observed request runs the handler's code paths for the first time
        # (3.8-6.3 ms seen with vLLM busy on the other core; later ones 0.2-1.4 ms).
        bound = PROXY_FORWARD_NS if rid != ttft_rows[0][0] else FIRST_FORWARD_NS
        assert rec.forwarded_ns - rec.arrival_ns <= bound, rec
    assert statistics.median(excess) <= slack, excess
    # Merged events: fewer gaps on the wire than tokens generated, never more.
    assert n_theirs * (1 - MERGED_SHARE) <= n_ours <= n_theirs
    # No speculative decoding: one token per event, but for those merges.
    records = list(proxy.sink.requests.values())
    assert len(per_event_known) == len(records)  # the proxy asked for usage on every stream
    assert statistics.median(per_event_known) == 1.0
    tokens = sum(r.completion_tokens or 0 for r in records)
    events = sum(r.output_events for r in records)
    assert events <= tokens <= events / (1 - MERGED_SHARE)
    per_event_hist = names.TOKENS_PER_EVENT.prom_name
    assert ours_all.sum(per_event_hist + "_count") == len(records)
    assert ours_all.sum(per_event_hist + "_sum") == pytest.approx(sum(per_event_known))
    assert ours_all.sum(names.ACCEPTANCE_LENGTH.prom_name + "_count") == 0
    if vllm.per_request_metrics:
        for rid, seen in engine_rows:
            t = proxy.sink.requests[rid].backend_timings
            assert t is not None, f"{rid}: vLLM sent no per-request metrics"
            assert t.queue_s is not None
            assert t.prefill_s is not None
            assert abs(t.queue_s - seen[VLLM_QUEUE]) <= ENGINE_TIMING_TOLERANCE_S, (rid, t, seen)
            assert abs(t.prefill_s - seen[VLLM_PREFILL]) <= ENGINE_TIMING_TOLERANCE_S, (rid, t)
            # The proxy's queue time holds the engine's, and transport and tokenising too.
            queue = proxy.sink.requests[rid].queue_time_s
            assert queue is not None
            assert queue >= t.queue_s - ENGINE_TIMING_TOLERANCE_S, (rid, queue, t)
        assert ours_all.sum(names.QUEUE_TIME.prom_name + "_count") >= len(engine_rows)
    else:
        assert all(r.backend_timings is None for r in records)
        assert ours_all.sum(names.QUEUE_TIME.prom_name + "_count") == 0
    for le, a, b, allowed in checks:
        assert abs(a - b) <= allowed, f"le {le}: {a} vs {b}, allowed {allowed}"
