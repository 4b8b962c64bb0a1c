"""The stall detector and the backend view with made-up stamps (a fake clock)."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporters import names
from exporters.prometheus import PrometheusSink
from proxy.config import ConfigError, config_from_argv
from proxy.core.backend_view import BackendView
from proxy.core.prompt_size import estimate_prompt_tokens
from proxy.core.records import (
    Backend,
    RequestLabels,
    StallCause,
    choice_stream_id,
)
from proxy.core.stall_detector import MedianWindow, StallDetector, StallSettings
from tests.stallkit import StallRecorder

MS = 1_000_000
BACKEND = Backend("vllm", "gpu-0")


# The view swallows its own errors (traffic first): here any of them fails the test.
pytestmark = pytest.mark.usefixtures("no_view_errors")

LABELS = RequestLabels("chat", "m", BACKEND)
SETTINGS_DEFAULT = StallSettings()


def make_view(**settings: float) -> tuple[BackendView, StallRecorder]:
    sink = StallRecorder()
    return BackendView(BACKEND, sink, StallSettings(**settings)), sink  # type: ignore[arg-type]


class Streams:
    """Drives a view: ``n`` streams decoding one token per step, all stamped alike."""

    def __init__(self, view: BackendView, n: int, step_ms: float = 25.0) -> None:
        self.view = view
        self.ids = [f"s{i}" for i in range(n)]
        self.last: dict[str, int] = {}
        self.now = 0
        self.step_ns = round(step_ms * MS)
        for i, rid in enumerate(self.ids):
            view.forwarded(rid, i * 1000)
        self.now = 10 * MS
        for rid in self.ids:
            view.first_token(rid, self.now)
            self.last[rid] = self.now

    def step(self, duration_ns: int | None = None, jitter: list[int] | None = None) -> int:
        """One engine step; returns its end. ``jitter`` delays each stream's token."""
        self.now += self.step_ns if duration_ns is None else duration_ns
        for i, rid in enumerate(self.ids):
            at = self.now + (jitter[i] if jitter else 0)
            self.view.gap(rid, self.last[rid], at)
            self.last[rid] = at
        return self.now

    def join(self, rid: str, first_token_ns: int) -> None:
        """``rid``'s first token: from now on it decodes with the others."""
        self.view.first_token(rid, first_token_ns)
        self.ids.append(rid)
        self.last[rid] = first_token_ns

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.step()

    def finish(self) -> None:
        for rid in self.ids:
            self.view.finished(rid, self.now + MS)


# -- the window and the detector ---------------------------------------------------------


def test_median_window_keeps_the_last_values_and_their_lower_median():
    w = MedianWindow(4)
    assert w.median() is None
    for v in (10, 40, 20):
        w.add(v)
    assert w.median() == 20
    w.add(30)
    assert w.median() == 20  # lower median of 10 20 30 40
    w.add(50)  # 10 leaves
    assert len(w) == 4
    assert w.median() == 30
    assert w.quantile(0.0) == 20
    assert w.quantile(1.0) == 50


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=200), st.integers(1, 20))
def test_median_window_matches_a_sorted_copy(values, size):
    w = MedianWindow(size)
    for i, v in enumerate(values):
        w.add(v)
        recent = sorted(values[max(0, i + 1 - size) : i + 1])
        assert w.median() == recent[(len(recent) - 1) // 2]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ratio", 1.0),
        ("ratio", float("nan")),
        ("floor_s", -1),
        ("tolerance_s", float("inf")),
        ("stream_window", 0),
        ("stream_min_gaps", 99),
        ("backend_min_gaps", 1000),
    ],
)
def test_settings_name_the_bad_key(key, value):
    with pytest.raises(ValueError, match=key.split("_")[0]):
        StallSettings(**{key: value})


def test_threshold_is_ratio_times_baseline_or_the_floor():
    s = StallSettings(ratio=3, floor_s=0.05)
    assert s.threshold_ns(25 * MS) == 75 * MS
    assert s.threshold_ns(5 * MS) == 50 * MS


def test_detector_young_stream_uses_the_backend_baseline_then_its_own():
    d = StallDetector(StallSettings(stream_min_gaps=4, backend_min_gaps=4))
    assert d.observe("a", 25 * MS).baseline_ns is None  # nothing known yet
    for _ in range(3):
        d.observe("a", 25 * MS)  # bootstrap: a's own window fills, unjudged
    assert d.backend_baseline_ns() is None
    for _ in range(4):
        assert d.observe("a", 25 * MS).baseline_ns == 25 * MS  # judged, shared with the backend
    assert d.backend_baseline_ns() == 25 * MS
    # "b" has no gaps of its own: judged by the backend (a's non-stall gaps).
    v = d.observe("b", 168 * MS)
    assert (v.baseline_ns, v.threshold_ns, v.stall) == (25 * MS, 75 * MS, True)
    for _ in range(3):
        d.observe("b", 40 * MS)
    assert d.baseline_ns("b") == 25 * MS  # the stall stays out: 3 gaps of its own
    d.observe("b", 40 * MS)
    assert d.baseline_ns("b") == 40 * MS
    d.close("b")
    assert len(d) == 1


def test_detector_keeps_stalls_out_of_the_baseline_until_the_pace_really_changed():
    d = StallDetector(StallSettings(stream_window=16, new_pace_after=32))
    for _ in range(16):
        d.observe("a", 25 * MS)
    # A long prompt in 2048-token chunks: 20 stalls in a row, all flagged.
    assert all(d.observe("a", 98 * MS).stall for _ in range(20))
    assert d.baseline_ns("a") == 25 * MS
    # A pace that stays 4x slower is the new pace after 32 + 8 gaps.
    verdicts = [d.observe("a", 100 * MS).stall for _ in range(40)]
    assert verdicts[:12] == [True] * 12
    assert verdicts[-1] is False


# -- the view: detection and attribution ----------------------------------------------------


def test_seed_unchunked_stall_names_the_long_prompt_whose_token_comes_just_after():
    view, sink = make_view()
    streams = Streams(view, 40)
    streams.steps(20)
    view.forwarded("long", streams.now + 3 * MS)
    end = streams.step(168 * MS)
    assert sink.stalls == []  # the culprit's first token has not arrived yet
    streams.join("long", end + 2 * MS)  # after the stalled streams' tokens
    streams.steps(3)
    assert len(sink.stalls) == 40
    for stall in sink.stalls:
        assert stall.cause is StallCause.PREFILL
        assert stall.culprits == ("long",)
        assert stall.baseline_ns == 25 * MS
        assert stall.threshold_ns == 75 * MS
        assert stall.duration_s == pytest.approx(0.168)
        assert stall.excess_s == pytest.approx(0.143)
    long = sink.prefill("long")
    assert (long.stalled_streams, long.stalls) == (40, 40)
    assert long.stutter_cost_s == pytest.approx(40 * 0.143)
    assert long.window_s == pytest.approx(0.167)  # forwarded 3 ms in, first token 2 ms late
    streams.finish()
    view.flush(streams.now + 10_000 * MS)
    assert sorted(p.request_id for p in sink.prefills) == sorted(streams.ids)
    assert view.recent_culprits == (long,)
    assert all(p.stalled_streams == 0 for p in sink.prefills if p.request_id != "long")


def test_chunked_prompt_below_the_ratio_is_no_stall():
    view, sink = make_view()
    streams = Streams(view, 40)
    streams.steps(20)
    view.forwarded("long", streams.now + MS)
    for _ in range(8):
        streams.step(43 * MS)
    streams.join("long", streams.now)
    streams.steps(3)
    assert sink.stalls == []
    assert sink.prefill("long").stalled_streams == 0


def test_chunked_prefill_stalls_before_its_first_token_are_pinned_on_it():
    view, sink = make_view()
    streams = Streams(view, 8)
    streams.steps(20)
    view.forwarded("long", streams.now + MS)
    view.forwarded("queued", streams.now + 30 * MS)  # behind it, first come first served
    for _ in range(3):
        streams.step(98 * MS)
    streams.join("long", streams.now + MS)
    streams.step(98 * MS)  # the queued one's only chunk
    streams.join("queued", streams.now)
    streams.steps(3)
    named = [s.culprits for s in sink.stalls]
    assert named == [("long",)] * 24 + [("queued",)] * 9
    long = sink.prefill("long")
    assert (long.stalled_streams, long.stalls) == (8, 24)
    assert sink.prefill("queued").stalled_streams == 9  # "long", now decoding, too


def test_queued_request_overlapping_a_stall_is_not_named():
    view, sink = make_view()
    streams = Streams(view, 10)
    streams.steps(20)
    view.forwarded("a", streams.now + MS)
    view.forwarded("b", streams.now + 2 * MS)
    end_a = streams.step(150 * MS)
    streams.join("a", end_a + MS)
    end_b = streams.step(150 * MS)
    streams.join("b", end_b)
    streams.steps(3)
    assert [s.culprits for s in sink.stalls] == [("a",)] * 10 + [("b",)] * 11
    assert sink.prefill("a").stalled_streams == 10
    assert sink.prefill("b").stalled_streams == 11  # "a" itself, now decoding, too


def test_stall_without_any_prefill_is_unattributed():
    view, sink = make_view()
    streams = Streams(view, 5)
    streams.steps(20)
    streams.step(200 * MS)
    streams.steps(2)
    assert len(sink.stalls) == 5
    assert {s.cause for s in sink.stalls} == {StallCause.UNATTRIBUTED}
    assert {s.culprits for s in sink.stalls} == {()}


def test_delivery_jitter_does_not_make_stalls():
    view, sink = make_view()
    streams = Streams(view, 32)
    rng = random.Random(5)
    for _ in range(400):
        streams.step(rng.randrange(20 * MS, 40 * MS), [rng.randrange(0, 2 * MS) for _ in range(32)])
    assert sink.stalls == []


def test_floor_keeps_fast_backends_quiet():
    view, sink = make_view(floor_s=0.05)
    streams = Streams(view, 4, step_ms=5)
    streams.steps(20)
    streams.step(40 * MS)  # 8x the pace, under the floor
    streams.steps(2)
    assert sink.stalls == []


def test_first_gaps_without_any_baseline_are_judged_once_one_exists():
    view, sink = make_view(stream_min_gaps=4, backend_min_gaps=8)
    streams = Streams(view, 4)
    view.forwarded("long", streams.now + MS)
    streams.step(160 * MS)  # the very first gap of every stream: nothing to compare with
    streams.join("long", streams.now)
    assert sink.stalls == []
    streams.steps(10)
    assert [s.culprits for s in sink.stalls] == [("long",)] * 4
    assert sink.prefill("long").stalled_streams == 4


def test_attribution_is_final_within_max_delay_even_if_a_stream_hangs():
    view, sink = make_view(max_delay_s=1.0)
    streams = Streams(view, 3)
    streams.steps(10)
    view.forwarded("x", streams.now + MS)
    view.first_token("x", streams.now + 50 * MS)
    hung = streams.ids.pop()  # this stream goes silent: its gap might still be a stall
    streams.steps(10)
    assert all(p.request_id != "x" for p in sink.prefills)
    streams.steps(40)  # 1 s after x's first token
    assert sink.prefill("x").stalled_streams == 0
    view.finished(hung, streams.now)


def test_flush_reports_a_culprit_once_the_backend_went_idle():
    view, sink = make_view()
    streams = Streams(view, 3)
    streams.steps(10)
    view.forwarded("long", streams.now + MS)
    streams.step(160 * MS)
    view.first_token("long", streams.now + MS)
    streams.finish()
    view.finished("long", streams.now + 2 * MS)
    assert all(p.request_id != "long" for p in sink.prefills)  # nothing came after: not final
    view.flush(streams.now + 3 * MS + SETTINGS_DEFAULT.tolerance_ns)
    assert sink.prefill("long").stalled_streams == 3
    assert view.tracked == dict.fromkeys(view.tracked, 0)


def test_non_streamed_request_is_never_named():
    view, sink = make_view()
    streams = Streams(view, 4)
    streams.steps(10)
    view.describe("batch", LABELS, streamed=False)
    view.forwarded("batch", streams.now + MS)
    streams.step(150 * MS)
    streams.steps(2)
    assert {s.cause for s in sink.stalls} == {StallCause.UNATTRIBUTED}
    view.finished("batch", streams.now)
    assert view.tracked["described"] == 0


def test_described_culprit_carries_labels_and_is_logged_without_text(caplog):
    view, sink = make_view()
    streams = Streams(view, 6)
    streams.steps(10)
    body = {"messages": [{"role": "user", "content": "secret words " * 1000}]}
    hint = estimate_prompt_tokens(body)
    view.describe("long", LABELS, prompt_tokens_hint=hint)
    view.forwarded("long", streams.now + MS)
    with caplog.at_level(logging.INFO, logger="tokenstamp.stalls"):
        streams.step(160 * MS)
        streams.join("long", streams.now)
        streams.steps(3)
    record = sink.prefill("long")
    assert record.labels == LABELS
    assert record.prompt_tokens_hint == 3250
    (line,) = [r.getMessage() for r in caplog.records]
    assert "request_id=long prompt_tokens_est=3250" in line
    assert "streams_stalled=6 stalls=6" in line
    assert "secret" not in line


def test_cost_is_split_by_prompt_size_between_culprits():
    view, sink = make_view()
    streams = Streams(view, 2)
    streams.steps(10)
    for rid, hint in (("big", 3000), ("small", 1000)):
        view.describe(rid, LABELS, prompt_tokens_hint=hint)
        view.forwarded(rid, streams.now + MS)
    streams.step(125 * MS)  # both finish their prefill in this step (chunked)
    streams.join("big", streams.now)
    streams.join("small", streams.now + MS)
    streams.steps(3)
    assert {s.culprits for s in sink.stalls} == {("small", "big")}
    assert sink.prefill("big").stutter_cost_s == pytest.approx(2 * 0.1 * 0.75)
    assert sink.prefill("small").stutter_cost_s == pytest.approx(2 * 0.1 * 0.25)


def test_memory_stays_bounded_over_many_requests_and_a_long_stream():
    view, sink = make_view()
    rng = random.Random(1)
    now = 0
    view.forwarded("forever", 0)
    view.first_token("forever", MS)
    last = MS
    live: dict[str, int] = {}
    for i in range(20_000):
        now = last + 25 * MS
        view.gap("forever", last, now)
        last = now
        rid = f"r{i}"
        view.describe(rid, LABELS, prompt_tokens_hint=100)
        view.forwarded(rid, now + MS)
        view.first_token(rid, now + 20 * MS)
        live[rid] = now
        for done in [r for r, t in live.items() if now - t > 500 * MS or rng.random() < 0.01]:
            view.finished(done, now + 21 * MS)
            del live[done]
        if i % 1000 == 0:
            sizes = view.tracked
            assert sizes["open_windows"] <= 1
            assert sizes["closed_windows"] <= 100
            assert sizes["active_streams"] <= 30
            assert sizes["baselines"] <= 2
    assert len(sink.prefills) > 19_000


@pytest.fixture
def view_errors_allowed():
    """Requested by a test that makes the view log errors on purpose."""


def test_a_failing_sink_never_raises_into_the_stream(caplog, view_errors_allowed):
    class Broken:
        def stall(self, record):
            raise RuntimeError("exporter down")

        def prefill_done(self, record):
            raise RuntimeError("exporter down")

    view = BackendView(BACKEND, Broken())  # type: ignore[arg-type]
    streams = Streams(view, 3)
    with caplog.at_level(logging.ERROR, logger="tokenstamp.stalls"):
        streams.steps(10)
        view.forwarded("x", streams.now)
        streams.step(200 * MS)
        view.first_token("x", streams.now)
        streams.steps(3)
    assert "sink.stall failed" in caplog.text


# -- prompt size estimate ------------------------------------------------------------------


# -- configuration and exporter -----------------------------------------------------------


def test_stall_options_from_flags_and_environment():
    cfg = config_from_argv(
        ["--upstream", "http://u:1", "--stall-ratio", "4"],
        {"TOKENSTAMP_STALL_FLOOR": "0.1", "TOKENSTAMP_STALL_TOLERANCE": "0.002"},
    )
    assert (cfg.stall_ratio, cfg.stall_floor_s, cfg.stall_tolerance_s) == (4.0, 0.1, 0.002)
    defaults = config_from_argv(["--upstream", "http://u:1"], {})
    assert (defaults.stall_ratio, defaults.stall_floor_s) == (3.0, 0.05)
    with pytest.raises(ConfigError, match="--stall-ratio"):
        config_from_argv(["--upstream", "http://u:1", "--stall-ratio", "1"], {})
    with pytest.raises(ConfigError, match="TOKENSTAMP_STALL_FLOOR"):
        config_from_argv(["--upstream", "http://u:1"], {"TOKENSTAMP_STALL_FLOOR": "-1"})


def test_prometheus_sink_writes_the_four_stall_instruments():
    registry = CollectorRegistry()
    prom = PrometheusSink(registry)
    view = BackendView(BACKEND, prom)
    streams = Streams(view, 3)
    streams.steps(10)
    view.describe("long", LABELS, prompt_tokens_hint=4000)
    view.forwarded("long", streams.now)
    streams.step(168 * MS)
    streams.join("long", streams.now)
    streams.step(200 * MS)  # an unattributed one (long's first gap too)
    streams.steps(3)
    backend = {"gen_ai_provider_name": "vllm", "server_address": "gpu-0"}
    request = {**backend, "gen_ai_operation_name": "chat", "gen_ai_request_model": "m"}

    def value(inst: names.Instrument, suffix: str, **labels: str) -> float | None:
        return registry.get_sample_value(inst.prom_name + suffix, labels)

    cause = names.label_name(names.STALL_CAUSE)
    assert value(names.STALLS, "_total", **backend, **{cause: "prefill"}) == 3
    assert value(names.STALLS, "_total", **backend, **{cause: "unattributed"}) == 4
    assert value(names.STALL_DURATION, "_count", **backend, **{cause: "prefill"}) == 3
    assert value(names.STALL_DURATION, "_sum", **backend, **{cause: "prefill"}) == (
        pytest.approx(3 * 0.168)
    )
    assert value(names.STALLED_STREAMS, "_count", **request) == 1
    assert value(names.STALLED_STREAMS, "_sum", **request) == 3
    assert value(names.STUTTER_COST, "_total", **request) == pytest.approx(3 * 0.143)
    assert names.STUTTER_COST.prom_series == "tokenstamp_prefill_stutter_cost_seconds_total"


def test_each_choice_is_a_stream_and_its_stall_names_the_request():
    """n = 2: choice 1 reaches the view as a stream of its own id; its stall is reported
    with the request's id (the span's), its choice and the request's tenant."""
    view, sink = make_view()
    view.describe("a", LABELS._replace(tenant="acme"))
    view.forwarded("a", 0)
    view.first_token("a", 10 * MS)
    streams = Streams(view, 8)
    second = choice_stream_id("a", 1)
    last = {"a": 10 * MS, second: 12 * MS}

    def step(duration_ns: int | None = None) -> int:
        end = streams.step(duration_ns)
        for rid, before in last.items():
            view.gap(rid, before, end)
            last[rid] = end
        return end

    for _ in range(20):
        step()
    view.forwarded("long", streams.now + 3 * MS)
    end = step(168 * MS)
    streams.join("long", end + 2 * MS)
    for _ in range(3):
        step()
    mine = sorted((s.request_id, s.choice, s.tenant) for s in sink.stalls if s.request_id == "a")
    assert mine == [("a", 0, "acme"), ("a", 1, "acme")]
    assert all(s.culprits == ("long",) for s in sink.stalls)
    assert sink.prefill("long").stalled_streams == 8 + 2
