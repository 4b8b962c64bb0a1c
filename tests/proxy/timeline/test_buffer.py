"""The timeline buffer: records in, JSON feed out, bounded whatever comes in."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.records import (
    Backend,
    Outcome,
    Phase,
    PrefillRecord,
    RequestLabels,
    RequestRecord,
    StallCause,
    StallRecord,
)
from proxy.timeline.buffer import TimelineBuffer, TimelineCursor, TimelineSettings

MS = 1_000_000
S = 1_000_000_000
BACKEND = Backend("vllm", "gpu-0")
LABELS = RequestLabels("chat", "llama", BACKEND)
ORIGIN = 1_000 * S


def record(rid: str, **kw) -> RequestRecord:
    base = {
        "request_id": rid,
        "labels": LABELS,
        "streamed": True,
        "outcome": Outcome.OK,
        "status_code": 200,
        "error_type": "",
        "arrival_ns": ORIGIN,
        "forwarded_ns": ORIGIN + 1 * MS,
        "first_token_ns": ORIGIN + 101 * MS,
        "last_token_ns": ORIGIN + 200 * MS,
        "end_ns": ORIGIN + 201 * MS,
        "start_unix_ns": 0,
        "output_events": 3,
        "gap_count": 2,
        "max_gap_ns": 50 * MS,
        "prompt_tokens": 4000,
        "completion_tokens": 3,
        "cached_tokens": None,
        "finish_reasons": ("stop",),
        "response_model": "llama-3",
        "response_id": "chatcmpl-1",
        "request_model": "meta/llama-3",
    }
    base.update(kw)
    return RequestRecord(**base)


def stall(rid: str, start_ns: int, end_ns: int, culprits: tuple[str, ...] = ()) -> StallRecord:
    return StallRecord(
        request_id=rid,
        backend=BACKEND,
        start_ns=start_ns,
        end_ns=end_ns,
        baseline_ns=25 * MS,
        threshold_ns=75 * MS,
        cause=StallCause.PREFILL if culprits else StallCause.UNATTRIBUTED,
        culprits=culprits,
    )


def prefill(rid: str, tf: int, t1: int, stalled: int = 0) -> PrefillRecord:
    return PrefillRecord(
        request_id=rid,
        labels=LABELS,
        forwarded_ns=tf,
        first_token_ns=t1,
        prompt_tokens_hint=3990,
        stalls=stalled,
        stalled_streams=stalled,
        stutter_cost_s=0.14 * stalled,
    )


def stream(buf: TimelineBuffer, rid: str, tf: int, ticks: list[int], end: int | None = None):
    buf.forwarded(rid, tf)
    buf.first_token(rid, ticks[0])
    for a, b in itertools.pairwise(ticks):
        buf.gap(rid, a, b)
    if end is not None:
        buf.finished(rid, end)


def by_id(msg: dict) -> dict[str, dict]:
    return {s["id"]: s for s in msg["streams"]}


def test_records_in_json_out():
    buf = TimelineBuffer(BACKEND, origin_ns=ORIGIN)
    stream(buf, "a", ORIGIN + 1 * MS, [ORIGIN + 10 * MS, ORIGIN + 35 * MS, ORIGIN + 180 * MS])
    stream(buf, "long", ORIGIN + 20 * MS, [ORIGIN + 178 * MS])
    buf.stall(stall("a", ORIGIN + 35 * MS, ORIGIN + 180 * MS, ("long",)))
    buf.prefill_done(prefill("long", ORIGIN + 20 * MS, ORIGIN + 178 * MS, stalled=1))
    buf.finished("long", ORIGIN + 200 * MS)
    buf.request_finished(
        record("long", arrival_ns=ORIGIN + 19 * MS, first_token_ns=ORIGIN + 178 * MS)
    )

    msg = buf.snapshot(ORIGIN + 300 * MS)
    assert json.loads(json.dumps(msg)) == msg  # JSON-ready as it is
    assert msg["type"] == "snapshot"
    assert msg["backend"] == {"name": "gpu-0", "provider": "vllm"}
    assert msg["now_us"] == 300_000
    streams = by_id(msg)
    assert streams["a"]["ticks_us"] == [10_000, 35_000, 180_000]
    assert streams["a"]["forwarded_us"] == 1_000
    assert streams["a"]["first_token_us"] == 10_000
    assert streams["a"]["end_us"] is None
    assert streams["a"]["worst_gap_ms"] == 145.0
    assert streams["a"]["upstream_ttft_ms"] == 9.0
    assert streams["a"]["stalls"] == 1
    long = streams["long"]
    assert long["model"] == "meta/llama-3"
    assert long["prompt_tokens"] == 4000  # usage wins over the body's estimate
    assert long["prompt_estimated"] is False
    assert long["ttft_ms"] == 159.0
    assert long["outcome"] == "ok"
    assert long["stalled_streams"] == 1
    assert msg["stalls"] == [
        {
            "seq": 1,
            "stream": "a",
            "start_us": 35_000,
            "end_us": 180_000,
            "baseline_us": 25_000,
            "threshold_us": 75_000,
            "cause": "prefill",
            "culprits": ["long"],
        }
    ]
    assert msg["prefills"][0]["request_id"] == "long"
    assert msg["prefills"][0]["first_token_us"] == 178_000


def test_a_reasoning_stream_says_where_its_answer_begins():
    buf = TimelineBuffer(BACKEND, origin_ns=ORIGIN)
    ticks = [ORIGIN + t * MS for t in (100, 125, 150, 175, 200)]
    stream(buf, "thinker", ORIGIN + 1 * MS, ticks, end=ORIGIN + 201 * MS)
    stream(buf, "plain", ORIGIN + 1 * MS, ticks, end=ORIGIN + 201 * MS)
    assert by_id(buf.snapshot(ORIGIN + 300 * MS))["thinker"]["reasoning_us"] is None
    buf.request_finished(
        record(
            "thinker",
            first_token_ns=ticks[0],
            first_reasoning_ns=ticks[0],
            first_answer_ns=ticks[3],
            reasoning_events=3,
            reported_reasoning_tokens=30,
        )
    )
    buf.request_finished(record("plain", first_token_ns=ticks[0], first_answer_ns=ticks[0]))
    streams = by_id(buf.snapshot(ORIGIN + 300 * MS))
    thinker = streams["thinker"]
    assert (thinker["reasoning_us"], thinker["answer_us"]) == (100_000, 175_000)
    assert thinker["answer_ttft_ms"] == 175.0
    assert thinker["reasoning_ms"] == 75.0
    assert thinker["reasoning_tokens"] == 30  # the backend's count wins over events
    plain = streams["plain"]
    assert (plain["reasoning_us"], plain["answer_us"]) == (None, 100_000)
    assert plain["reasoning_ms"] is None
    assert plain["reasoning_tokens"] is None


def test_a_live_stream_learns_its_phases_from_the_sink_as_its_answer_begins():
    buf = TimelineBuffer(BACKEND, origin_ns=ORIGIN)
    ticks = [ORIGIN + t * MS for t in (100, 125, 150)]
    stream(buf, "thinker", ORIGIN + 1 * MS, ticks)  # open: no record yet
    # The timer reports the first answer event right after stamping its tick, then the
    # reasoning before it.
    buf.phase(LABELS, Phase.ANSWER, 0.150, "thinker")
    buf.phase(LABELS, Phase.REASONING, 0.050, "thinker")
    buf.phase(LABELS, Phase.TOOL_CALL, 0.150, "thinker")  # nothing to draw
    buf.phase(LABELS, Phase.ANSWER, 0.150, "nobody")  # not a row: ignored
    live = by_id(buf.snapshot(ORIGIN + 160 * MS))["thinker"]
    assert (live["reasoning_us"], live["answer_us"]) == (100_000, 150_000)
    assert (live["answer_ttft_ms"], live["reasoning_ms"]) == (150.0, 50.0)
    # A stream without reasoning learns only where its answer began: no phases to draw.
    stream(buf, "plain", ORIGIN + 1 * MS, [ORIGIN + 90 * MS])
    buf.phase(LABELS, Phase.ANSWER, 0.090, "plain")
    plain = by_id(buf.snapshot(ORIGIN + 160 * MS))["plain"]
    assert (plain["reasoning_us"], plain["answer_us"]) == (None, 90_000)


def test_a_stream_that_only_reasoned_has_no_answer():
    buf = TimelineBuffer(BACKEND, origin_ns=ORIGIN)
    stream(buf, "r", ORIGIN + 1 * MS, [ORIGIN + 100 * MS, ORIGIN + 150 * MS], ORIGIN + 160 * MS)
    buf.request_finished(
        record(
            "r",
            first_token_ns=ORIGIN + 100 * MS,
            first_reasoning_ns=ORIGIN + 100 * MS,
            end_ns=ORIGIN + 160 * MS,
            reasoning_events=2,
        )
    )
    r = by_id(buf.snapshot(ORIGIN + 300 * MS))["r"]
    assert (r["reasoning_us"], r["answer_us"], r["answer_ttft_ms"]) == (100_000, None, None)
    assert r["reasoning_ms"] == 60.0  # to the end
    assert r["reasoning_tokens"] == 2


def test_estimate_shown_until_usage_arrives():
    buf = TimelineBuffer(BACKEND, origin_ns=ORIGIN)
    stream(buf, "r", ORIGIN, [ORIGIN + 100 * MS])
    buf.prefill_done(prefill("r", ORIGIN, ORIGIN + 100 * MS))
    s = by_id(buf.snapshot(ORIGIN + S))["r"]
    assert (s["prompt_tokens"], s["prompt_estimated"], s["model"]) == (3990, True, "llama")
    assert s["ttft_ms"] is None


def test_deltas_carry_only_what_changed():
    buf = TimelineBuffer(BACKEND, origin_ns=ORIGIN)
    cursor = TimelineCursor()
    stream(buf, "a", ORIGIN, [ORIGIN + 10 * MS, ORIGIN + 20 * MS])
    stream(buf, "b", ORIGIN, [ORIGIN + 11 * MS])
    first = buf.feed(cursor, ORIGIN + 30 * MS)
    assert first["type"] == "snapshot"
    assert {s["id"] for s in first["streams"]} == {"a", "b"}

    buf.gap("a", ORIGIN + 20 * MS, ORIGIN + 45 * MS)
    buf.stall(stall("b", ORIGIN + 11 * MS, ORIGIN + 90 * MS))
    second = buf.feed(cursor, ORIGIN + 100 * MS)
    assert second["type"] == "delta"
    streams = by_id(second)
    assert streams["a"]["ticks_us"] == [45_000]
    assert streams["a"]["tick_index"] == 2
    assert streams["b"]["ticks_us"] == []  # only its stall count changed
    assert [s["seq"] for s in second["stalls"]] == [1]

    third = buf.feed(cursor, ORIGIN + 200 * MS)
    assert third["streams"] == []
    assert third["stalls"] == []
    # A new reader starts with everything again.
    fresh = buf.feed(TimelineCursor(), ORIGIN + 200 * MS)
    assert by_id(fresh)["a"]["ticks_us"] == [10_000, 20_000, 45_000]
    assert len(fresh["stalls"]) == 1


def test_window_drops_old_streams_stamps_stalls_and_prefills():
    buf = TimelineBuffer(BACKEND, TimelineSettings(window_s=1.0), origin_ns=ORIGIN)
    stream(buf, "old", ORIGIN, [ORIGIN + 10 * MS, ORIGIN + 20 * MS], end=ORIGIN + 30 * MS)
    stream(buf, "open", ORIGIN, [ORIGIN + 10 * MS, ORIGIN + 1500 * MS])
    buf.stall(stall("open", ORIGIN + 10 * MS, ORIGIN + 400 * MS))
    buf.prefill_done(prefill("old", ORIGIN, ORIGIN + 10 * MS))
    msg = buf.snapshot(ORIGIN + 2 * S)
    assert set(by_id(msg)) == {"open"}  # still open, so kept: only its old stamps go
    assert by_id(msg)["open"]["ticks_us"] == [1_500_000]
    assert by_id(msg)["open"]["tokens"] == 2
    assert msg["stalls"] == []
    assert msg["prefills"] == []
    assert buf.tracked == {"streams": 1, "ticks": 1, "stalls": 0, "prefills": 0}


def test_stream_limit_drops_finished_first_then_counts_untracked():
    buf = TimelineBuffer(BACKEND, TimelineSettings(max_streams=2), origin_ns=ORIGIN)
    stream(buf, "done", ORIGIN, [ORIGIN + MS], end=ORIGIN + 2 * MS)
    stream(buf, "open", ORIGIN, [ORIGIN + MS])
    buf.forwarded("new", ORIGIN + 3 * MS)
    assert set(by_id(buf.snapshot(ORIGIN + 4 * MS))) == {"open", "new"}
    buf.forwarded("too-many", ORIGIN + 5 * MS)
    buf.first_token("too-many", ORIGIN + 6 * MS)
    msg = buf.snapshot(ORIGIN + 7 * MS)
    assert set(by_id(msg)) == {"open", "new"}
    assert msg["untracked"] == 1


def test_stamps_per_stream_are_capped():
    buf = TimelineBuffer(BACKEND, TimelineSettings(max_ticks=5), origin_ns=ORIGIN)
    stream(buf, "r", ORIGIN, [ORIGIN + i * MS for i in range(1, 21)])
    s = by_id(buf.snapshot(ORIGIN + S))["r"]
    assert s["ticks_us"] == [16_000, 17_000, 18_000, 19_000, 20_000]
    assert s["tokens"] == 20
    assert s["tick_index"] == 15


def test_unstreamed_request_leaves_no_row():
    buf = TimelineBuffer(BACKEND, origin_ns=ORIGIN)
    buf.forwarded("plain", ORIGIN)
    buf.finished("plain", ORIGIN + 50 * MS)
    buf.request_finished(record("plain", streamed=False, first_token_ns=None))
    assert buf.snapshot(ORIGIN + S)["streams"] == []


def test_retry_restarts_the_prefill_window():
    buf = TimelineBuffer(BACKEND, origin_ns=ORIGIN)
    buf.forwarded("r", ORIGIN)
    buf.forwarded("r", ORIGIN + 40 * MS)
    assert by_id(buf.snapshot(ORIGIN + S))["r"]["forwarded_us"] == 40_000


@pytest.mark.parametrize(
    "bad",
    [{"window_s": 0}, {"window_s": float("nan")}, {"max_streams": 0}, {"max_ticks": 0}],
)
def test_settings_are_checked(bad):
    with pytest.raises(ValueError, match="timeline"):
        TimelineSettings(**bad)


EVENT = st.tuples(
    st.sampled_from(["forwarded", "first", "gap", "finished", "stall", "prefill", "record"]),
    st.integers(0, 30),  # request number
    st.integers(0, 50 * MS),  # time step
)


@settings(max_examples=60, deadline=None)
@given(st.lists(EVENT, max_size=400))
def test_memory_stays_bounded_whatever_comes(events):
    limits = TimelineSettings(
        window_s=0.5, max_streams=8, max_ticks=16, max_stalls=10, max_prefills=6
    )
    buf = TimelineBuffer(BACKEND, limits, origin_ns=ORIGIN)
    cursor = TimelineCursor()
    now = ORIGIN
    for i, (kind, n, step) in enumerate(events):
        now += step
        rid = f"r{n}"
        if kind == "forwarded":
            buf.forwarded(rid, now)
        elif kind == "first":
            buf.first_token(rid, now)
        elif kind == "gap":
            buf.gap(rid, now - step, now)
        elif kind == "finished":
            buf.finished(rid, now)
        elif kind == "stall":
            buf.stall(stall(rid, now - step, now, (f"r{(n + 1) % 31}",)))
        elif kind == "prefill":
            buf.prefill_done(prefill(rid, now - step, now, stalled=n % 3))
        else:
            buf.request_finished(record(rid))
        sizes = buf.tracked
        assert sizes["streams"] <= 8
        assert sizes["ticks"] <= 8 * 16
        assert sizes["stalls"] <= 10
        assert sizes["prefills"] <= 6
        if i % 25 == 0:
            msg = buf.feed(cursor, now)
            assert len(cursor.seen) <= 8
            assert all(
                s["end_us"] is None or s["end_us"] >= (now - ORIGIN) // 1000 - 500_000
                for s in msg["streams"]
            )
