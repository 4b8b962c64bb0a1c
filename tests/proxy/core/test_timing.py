"""The stream timer with a fake clock: TTFT, gaps, TPOT, the record."""

from __future__ import annotations

import pytest

from proxy.core.decoders.openai import ChunkInfo, Usage
from proxy.core.records import (
    Backend,
    EventKind,
    Outcome,
    Phase,
    RequestLabels,
    RequestRecord,
    choice_stream_id,
    split_stream_id,
)
from proxy.core.timing import MAX_CHOICES, StreamTimer, gap_targets
from proxy.timeline.tokenlog import FanoutWatcher

MS = 1_000_000
LABELS = RequestLabels("chat", "m", Backend("vllm", "b"))


class Recorder:
    def __init__(self) -> None:
        self.started = 0
        self.gaps: list[float] = []
        self.records: list[RequestRecord] = []
        self.first_tokens: list[tuple] = []

    def request_started(self, labels):
        self.started += 1

    def first_token(self, labels, ttft_s, upstream_ttft_s, request_id, trace_id=""):
        self.first_tokens.append((ttft_s, upstream_ttft_s, request_id, trace_id))

    def gap(self, labels, gap_s, request_id, trace_id=""):
        self.gaps.append(gap_s)

    def request_finished(self, record):
        self.records.append(record)

    def decoder_error(self, backend, kind):
        raise AssertionError

    def unobserved(self, backend, reason):
        raise AssertionError


class Watch:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def forwarded(self, rid, ns):
        self.calls.append(("forwarded", ns))

    def first_token(self, rid, ns):
        self.calls.append(("first", ns))

    def gap(self, rid, a, b):
        self.calls.append(("gap", a, b))

    def finished(self, rid, ns):
        self.calls.append(("finished", ns))


OUT = ChunkInfo(output=True)


def run(stamps_ms: list[int], usage: Usage | None = None):
    sink, watch = Recorder(), Watch()
    t = StreamTimer("r1", LABELS, arrival_ns=0, start_unix_ns=5, sink=sink, watcher=watch)
    t.forwarded(1 * MS)
    t.chunk(ChunkInfo(output=False, model="m-resp", response_id="id1"), 2 * MS)  # role chunk
    for s in stamps_ms:
        t.chunk(OUT, s * MS)
    if usage is not None:
        t.chunk(ChunkInfo(output=False, usage=usage, usage_only=True), stamps_ms[-1] * MS)
    rec = t.finish(stamps_ms[-1] * MS + MS, Outcome.OK, 200)
    return rec, sink, watch


def test_seed_single_request_figures():
    # 320 ms to the first token, then 479 tokens at 22 ms: the seed's first table.
    stamps = [320 + 22 * i for i in range(480)]
    rec, sink, watch = run(stamps)
    assert rec.ttft_s == pytest.approx(0.320)
    assert rec.upstream_ttft_s == pytest.approx(0.319)
    assert rec.tpot_s == pytest.approx(0.022)
    assert rec.gap_count == 479
    assert sink.gaps == pytest.approx([0.022] * 479)
    assert rec.duration_s == pytest.approx(0.320 + 0.022 * 479 + 0.001)
    assert rec.response_model == "m-resp"
    assert rec.response_id == "id1"
    assert watch.calls[0] == ("forwarded", MS)
    assert watch.calls[1] == ("first", 320 * MS)
    assert watch.calls[2] == ("gap", 320 * MS, 342 * MS)
    assert watch.calls[-1][0] == "finished"


def test_first_token_reported_once_at_the_first_output_event():
    sink, watch = Recorder(), Watch()
    t = StreamTimer("r1", LABELS, arrival_ns=0, start_unix_ns=5, sink=sink, watcher=watch)
    t.trace_id = "ab" * 16
    t.forwarded(2 * MS)
    t.chunk(ChunkInfo(output=False, model="m"), 5 * MS)  # role chunk: not an output event
    assert sink.first_tokens == []
    t.chunk(OUT, 40 * MS)
    # Live: reported before any gap and before the end, with both TTFTs and the trace id.
    assert sink.first_tokens == [(pytest.approx(0.040), pytest.approx(0.038), "r1", "ab" * 16)]
    assert sink.records == []
    for ms in (60, 80):
        t.chunk(OUT, ms * MS)
    rec = t.finish(90 * MS, Outcome.CLIENT_DISCONNECT, 200, "client_disconnect")
    assert len(sink.first_tokens) == 1
    assert sink.first_tokens[0][0] == rec.ttft_s


def test_no_first_token_without_output():
    sink = Recorder()
    t = StreamTimer("r1", LABELS, arrival_ns=0, start_unix_ns=5, sink=sink)
    t.chunk(ChunkInfo(output=False, model="m"), 5 * MS)
    rec = t.finish(9 * MS, Outcome.UPSTREAM_ERROR, 200, "ClientPayloadError")
    assert sink.first_tokens == []
    assert rec.ttft_s is None
    assert rec.tokens_per_event is None


def test_tpot_uses_backend_token_count():
    # 3 output events but the backend says 7 tokens (events can carry several tokens).
    rec, _, _ = run([100, 160, 220], Usage(prompt_tokens=4, completion_tokens=7, cached_tokens=0))
    assert rec.output_tokens == 7
    assert rec.tokens_per_event is None  # not a stream (the relay sets streamed)
    assert rec.tpot_s == pytest.approx(0.120 / 6)
    assert rec.prefix_cache == "miss"
    assert rec.max_gap_s == pytest.approx(0.060)


def test_one_token_has_no_tpot_and_no_gaps():
    rec, sink, _ = run([50])
    assert rec.tpot_s is None
    assert rec.gap_count == 0
    assert sink.gaps == []
    assert rec.prefix_cache == "unknown"


def test_same_read_events_share_a_stamp():
    _rec, sink, _ = run([100, 100, 130])
    assert sink.gaps == [0.0, 0.03]


def test_no_output_means_no_ttft():
    sink = Recorder()
    t = StreamTimer("r", LABELS, arrival_ns=0, start_unix_ns=0, sink=sink)
    rec = t.finish(10, Outcome.UPSTREAM_ERROR, 502, "x")
    assert rec.ttft_s is None
    assert rec.upstream_ttft_s is None
    assert rec.tpot_s is None
    assert sink.started == 1
    assert sink.records == [rec]


def test_each_timer_sends_its_gaps_to_its_own_watchers_whichever_came_before():
    """Timers share their watcher's gap targets (memory per stream): never another's."""
    first, second, third = Watch(), Watch(), Watch()
    fanout = FanoutWatcher(second, third)

    def one_gap(watcher, at_ms: int) -> None:
        t = StreamTimer("r", LABELS, arrival_ns=0, start_unix_ns=0, sink=Recorder(),
                        watcher=watcher)  # fmt: skip
        t.output(at_ms * MS)
        t.output((at_ms + 1) * MS)

    for watcher, at_ms in ((first, 10), (fanout, 20), (first, 30), (None, 40), (fanout, 50)):
        one_gap(watcher, at_ms)
    gaps = [[c[1] // MS for c in w.calls if c[0] == "gap"] for w in (first, second, third)]
    assert gaps == [[10, 30], [20, 50], [20, 50]]


def test_timers_given_the_proxys_gap_targets_call_them_and_nothing_else():
    """A proxy builds ``gap_targets`` once and hands the one tuple to every timer."""
    second, third, other = Watch(), Watch(), Watch()
    shared = gap_targets(FanoutWatcher(second, third))
    assert shared == (second.gap, third.gap)
    for at_ms in (10, 20):
        t = StreamTimer("r", LABELS, arrival_ns=0, start_unix_ns=0, sink=Recorder(),
                        watcher=other, watcher_gaps=shared)  # fmt: skip
        t.output(at_ms * MS)
        t.output((at_ms + 1) * MS)
    gaps = [[c[1] // MS for c in w.calls if c[0] == "gap"] for w in (second, third, other)]
    assert gaps == [[10, 20], [10, 20], []]
    assert gap_targets(None) == ()


class PhaseRecorder(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.phases: list[tuple] = []

    def phase(self, labels, phase, seconds, request_id, trace_id=""):
        self.phases.append((phase, seconds))


class IdWatch(Watch):
    """Names the stream of every call (a choice > 0 is a stream of its own)."""

    def first_token(self, rid, ns):
        self.calls.append(("first", rid, ns))

    def gap(self, rid, a, b):
        self.calls.append(("gap", rid, a, b))

    def finished(self, rid, ns):
        self.calls.append(("finished", rid, ns))


def test_two_choices_are_two_streams():
    """n = 2, interleaved every 10 ms: each choice's gaps are 20 ms; choice 1 is its own
    stream for the stall view; TTFT once, at the first event of either."""
    sink, watch = PhaseRecorder(), IdWatch()
    t = StreamTimer("r1", LABELS, arrival_ns=0, start_unix_ns=0, sink=sink, watcher=watch)
    for i in range(6):
        t.chunk(ChunkInfo(output=True, choice=i % 2), (100 + 10 * i) * MS)
    rec = t.finish(200 * MS, Outcome.OK, 200)
    assert len(sink.first_tokens) == 1
    assert sink.first_tokens[0][0] == pytest.approx(0.100)
    assert sink.gaps == pytest.approx([0.020] * 4)
    assert rec.gap_count == 4
    assert rec.output_events == 6
    assert rec.max_gap_ns == 20 * MS
    assert rec.last_token_ns == 150 * MS
    assert [(c.choice, c.events, c.tpot_s) for c in rec.choices] == [
        (0, 3, pytest.approx(0.020)), (1, 3, pytest.approx(0.020))
    ]  # fmt: skip
    assert rec.tpot_s == pytest.approx(0.020)
    assert rec.stream_tpots_s == pytest.approx((0.020, 0.020))
    assert rec.stream_max_gaps_s == pytest.approx((0.020, 0.020))
    stream1 = choice_stream_id("r1", 1)
    assert ("first", "r1", 100 * MS) in watch.calls
    assert ("gap", "r1", 100 * MS, 120 * MS) in watch.calls
    assert ("gap", stream1, 110 * MS, 130 * MS) in watch.calls
    assert ("finished", stream1, 200 * MS) in watch.calls
    assert split_stream_id(stream1) == ("r1", 1)
    assert split_stream_id("r1") == ("r1", 0)


def test_phases_reasoning_then_answer_then_a_tool_call():
    sink = PhaseRecorder()
    t = StreamTimer("r1", LABELS, arrival_ns=0, start_unix_ns=0, sink=sink)
    t.reasoning(100 * MS)
    t.reasoning(120 * MS)
    t.chunk(ChunkInfo(output=True, kind=EventKind.ANSWER), 400 * MS)
    t.chunk(ChunkInfo(output=True, kind=EventKind.TOOL_CALL), 500 * MS)
    t.token(520 * MS)
    t.chunk(ChunkInfo(output=False, usage=Usage(3, 9, None, reasoning_tokens=2)), 530 * MS)
    rec = t.finish(600 * MS, Outcome.OK, 200)
    assert sink.first_tokens[0][0] == pytest.approx(0.100)
    assert sink.phases == [
        (Phase.ANSWER, pytest.approx(0.400)),
        (Phase.REASONING, pytest.approx(0.300)),
        (Phase.TOOL_CALL, pytest.approx(0.500)),
    ]
    assert rec.answer_ttft_s == pytest.approx(0.400)
    assert rec.reasoning_s == pytest.approx(0.300)
    assert rec.tool_call_ttft_s == pytest.approx(0.500)
    assert rec.reasoning_tokens == 2
    assert rec.reasoning_events == 2
    assert rec.output_events == 5
    assert rec.gap_count == 4
    assert rec.choices == ()


def test_a_request_that_only_reasons_reports_reasoning_at_its_end():
    sink = PhaseRecorder()
    t = StreamTimer("r1", LABELS, arrival_ns=0, start_unix_ns=0, sink=sink)
    for s in (100, 110, 120):
        t.reasoning(s * MS)
    t.chunk(ChunkInfo(output=False, usage=Usage(3, 3, None, reasoning_tokens=0)), 125 * MS)
    rec = t.finish(130 * MS, Outcome.OK, 200)
    assert sink.phases == [(Phase.REASONING, pytest.approx(0.030))]
    assert rec.answer_ttft_s is None
    assert rec.reasoning_tokens == 3  # a reported 0 means "none reported": the events count
    assert rec.slo_met(1.0, 1.0)
    assert not rec.slo_met(1.0, 1.0, answer_ttft_s=10.0)  # it never answered


def test_many_choices_are_bounded():
    sink = PhaseRecorder()
    t = StreamTimer("r1", LABELS, arrival_ns=0, start_unix_ns=0, sink=sink)
    for i in range(MAX_CHOICES + 50):
        t.chunk(ChunkInfo(output=True, choice=i + 1), (100 + i) * MS)
    rec = t.finish(10_000 * MS, Outcome.OK, 200)
    assert len(rec.choices) == MAX_CHOICES + 1  # the rest counted as choice 0's
    assert rec.output_events == MAX_CHOICES + 50
