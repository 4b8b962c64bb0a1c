"""The context term of the cost model on exact stamps from a known step model (fake clock).

A small step loop stands in for an engine whose prefill pieces cost more the more of
their prompt is already in context: a step decoding ``n`` streams and carrying a piece of
``x`` tokens after ``L`` costs ``base + per_stream x n + step + x / rate + context x x (L +
x)``. The stamps go to ``AdvisorObservations`` as the proxy would send them; the fit
must give the model back, keep the term only where it is there, and say why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from proxy.advisor.context import (
    CONTEXT_MIN_SHARE,
    StepPoint,
    WindowTotal,
    fit_context,
    rate_on_totals,
    total_s,
)
from proxy.advisor.fit import Fit, fit
from proxy.advisor.observations import AdvisorObservations
from proxy.advisor.predict import largest_chunk, pieces, prefill_pool, table
from proxy.advisor.report import AdviceOptions, advise, render
from proxy.core.records import Backend, PrefillRecord, RequestLabels

BACKEND = Backend("llama.cpp", "cpu")


@dataclass(frozen=True)
class StepModel:
    """The engine's true cost model."""

    base_s: float = 0.015
    per_stream_s: float = 0.0007
    step_s: float = 0.0
    inv_rate: float = 1 / 4000
    context_s: float = 5e-8
    chunk: int | None = 700

    def prefill_s(self, tokens: int, before: int) -> float:
        return self.step_s + tokens * self.inv_rate + self.context_s * tokens * (before + tokens)


def drive(
    model: StepModel,
    prompts: list[int],
    streams: int = 12,
    api_delay: float = 0.0,
    late_first_token: bool = False,
) -> AdvisorObservations:
    """``streams`` streams ending one after another; the long ``prompts`` one at a time, each
    forwarded a third into a running step and computed from the next one on, in pieces.

    ``api_delay`` (a share of a decode step): the engine's API server, taking the long
    request in, delays the streams' tokens of the step it is forwarded in by that much; the
    next step is a decode step whose token comes on time (the delay given back), and the
    prompt is computed from the step after it.

    ``late_first_token``: the API server sends a long request's first token two decode steps
    after its last piece, and the streams' token of the step after that piece 0.8 of a
    decode step late (in the window, as an elevated step)."""
    obs = AdvisorObservations(BACKEND)
    labels = RequestLabels("chat", "m", BACKEND)
    left = {f"s{k}": 160 + 10 * k for k in range(streams)}
    for rid in left:
        obs.forwarded(rid, 0)
    now_ns = round(model.base_s * 1e9)
    last = dict.fromkeys(left, now_ns)
    for rid in left:
        obs.first_token(rid, now_ns)
    queue = list(enumerate(prompts))
    current: tuple[str, list[int]] | None = None  # the prompt being computed, pieces left
    before = 0
    step = 0
    hold = 0  # decode steps before the prompt's first piece
    delay_ns = 0
    pending_ns = 0  # the late read of the step after a prompt's last piece
    while left or current or queue:
        step += 1
        piece = 0
        if current is not None and hold:
            hold -= 1
        elif current is not None:
            piece = current[1].pop(0)
        dur_s = model.base_s + model.per_stream_s * len(left)
        if piece:
            dur_s += model.prefill_s(piece, before)
        start_ns, end_ns = now_ns, now_ns + round(dur_s * 1e9)
        if current is None and queue and step >= 25 and step % 25 == 0:
            i, prompt = queue.pop(0)
            rid = f"long{i}"
            tf = start_ns + (end_ns - start_ns) // 3
            obs.forwarded(rid, tf)
            obs.prefill_done(PrefillRecord(rid, labels, tf, tf, prompt, 0, 0, 0.0))
            current, before = (rid, pieces(prompt, model.chunk)), 0
            if api_delay:
                hold, delay_ns = 1, round(api_delay * (end_ns - start_ns))
        done = None
        if piece and current is not None:
            before += piece
            if not current[1]:  # its first token comes with the others' (read first here)
                done, current = current[0], None
                if late_first_token:
                    decode_ns = round((model.base_s + model.per_stream_s * len(left)) * 1e9)
                    obs.first_token(done, end_ns + 2 * decode_ns)
                    pending_ns = round(0.8 * decode_ns)
                else:
                    obs.first_token(done, end_ns)
        read_ns, delay_ns = end_ns + delay_ns, 0
        if pending_ns and not piece:
            read_ns, pending_ns = read_ns + pending_ns, 0
        for rid in list(left):
            obs.gap(rid, last[rid], read_ns)
            last[rid] = read_ns
            left[rid] -= 1
            if left[rid] == 0:
                del left[rid]
                obs.finished(rid, end_ns)
        if done is not None:
            left[done], last[done] = 1, end_ns
        now_ns = end_ns
    obs.flush(now_ns + 10**9)
    return obs


def worst_and_ttft(model: StepModel, prompt: int, streams: int, chunk: int | None) -> float:
    """The true worst step of ``streams`` decoding while ``prompt`` is computed at ``chunk``."""
    decode_s = model.base_s + model.per_stream_s * streams
    out, before = [], 0
    for piece in pieces(prompt, chunk):
        out.append(decode_s + model.prefill_s(piece, before))
        before += piece
    return max(out)


CHUNKED = [3100, 4500, 2600, 5300]
UNCHUNKED = [1200, 800, 1500, 600, 1000]


def test_the_context_term_is_recovered_from_chunked_prefills_and_kept():
    model = StepModel()
    fitted = fit(drive(model, CHUNKED).snapshot())
    assert fitted.missing == ()
    assert fitted.prefill_context_s == pytest.approx(model.context_s, rel=0.02)
    assert fitted.fit_record.prefill_tokens_per_s == pytest.approx(4000, rel=0.02)
    assert fitted.fit_record.chunk_size == pytest.approx(700, abs=3)
    assert fitted.prefill_step_s == pytest.approx(0, abs=1e-3)
    note = fitted.observations["prefill_context_note"]
    assert isinstance(note, str)
    assert note.endswith("kept"), note
    with_term = fitted.quality["prefill_context_residual_rel"]
    without = fitted.quality["prefill_context_residual_without_rel"]
    assert with_term is not None
    assert without is not None
    assert with_term < without
    assert fitted.observations["prefill_context_steps"] == sum(math.ceil(p / 700) for p in CHUNKED)


def test_every_chunk_size_is_predicted_with_the_context_before_each_piece():
    model = StepModel()
    fitted = fit(drive(model, CHUNKED).snapshot())
    for chunk in (256, 700, 2048, None):
        (row,) = table(fitted, 6000, 10, [chunk])
        assert row.worst_gap_s == pytest.approx(worst_and_ttft(model, 6000, 10, chunk), rel=0.02)
        true_total = sum(
            model.prefill_s(p, sum(pieces(6000, chunk)[:j]))
            for j, p in enumerate(pieces(6000, chunk))
        )
        decode_s = model.base_s + model.per_stream_s * 10
        want_ttft = row.steps * decode_s + true_total + decode_s / 2
        assert row.ttft_s == pytest.approx(want_ttft, rel=0.02)
    # Later pieces are dearer: at 700 the worst is the last full piece, not the first.
    (row,) = table(fitted, 6000, 10, [700])
    first = model.base_s + model.per_stream_s * 10 + model.prefill_s(700, 0)
    assert row.worst_gap_s > 1.5 * first
    pool = prefill_pool(fitted, 6000, 10, kv_transfer_s=0.0)
    assert pool.ttft_s == pytest.approx(model.base_s + model.prefill_s(6000, 0), rel=0.02)


def test_the_largest_chunk_within_a_target_accounts_for_the_context():
    model = StepModel()
    fitted = fit(drive(model, CHUNKED).snapshot())
    target_s = 0.5
    chunk = largest_chunk(fitted, 6000, 10, target_s)
    assert chunk is not None
    assert worst_and_ttft(model, 6000, 10, chunk) <= target_s * 1.02
    assert worst_and_ttft(model, 6000, 10, round(chunk * 1.05)) > target_s * 0.98


def test_the_api_servers_delay_at_a_windows_start_is_no_piece():
    # The step the long request is forwarded in comes 0.8 of a decode step late to every
    # stream: an elevated "step" at the window's start, far below the first piece.
    model = StepModel()
    fitted = fit(drive(model, CHUNKED, api_delay=0.8).snapshot())
    assert [w.pieces for w in fitted.windows] == [math.ceil(p / 700) for p in CHUNKED]
    assert fitted.fit_record.chunk_size == pytest.approx(700, abs=3)
    assert fitted.prefill_context_s == pytest.approx(model.context_s, rel=0.03)
    assert fitted.fit_record.prefill_tokens_per_s == pytest.approx(4000, rel=0.03)


def test_the_api_servers_late_first_token_is_no_piece():
    # The long request's first token comes two decode steps late; the streams' next step,
    # 0.8 of a step late, ends in its window: an elevated "step" after the last piece.
    model = StepModel(chunk=None, inv_rate=1 / 250, context_s=7.5e-7)
    fitted = fit(drive(model, UNCHUNKED, streams=8, late_first_token=True).snapshot())
    assert [w.pieces for w in fitted.windows] == [1] * len(UNCHUNKED)
    assert fitted.fit_record.chunked is False
    # Chunked: the last pieces (300, 500 of 700) are kept.
    model = StepModel()
    fitted = fit(drive(model, CHUNKED, late_first_token=True).snapshot())
    assert [w.pieces for w in fitted.windows] == [math.ceil(p / 700) for p in CHUNKED]
    assert fitted.fit_record.chunk_size == pytest.approx(700, abs=3)


def test_a_step_cost_and_a_context_term_are_told_apart():
    model = StepModel(step_s=0.030)
    fitted = fit(drive(model, CHUNKED).snapshot())
    assert fitted.prefill_context_s == pytest.approx(model.context_s, rel=0.03)
    assert fitted.prefill_step_s == pytest.approx(0.030, rel=0.05)
    assert fitted.fit_record.prefill_tokens_per_s == pytest.approx(4000, rel=0.03)
    step_note = fitted.observations["prefill_step_note"]
    assert isinstance(step_note, str)
    assert step_note.endswith("; kept"), step_note
    assert "is told from 0" in step_note


def test_no_context_effect_drops_the_term_and_says_why():
    model = StepModel(context_s=0.0)
    fitted = fit(drive(model, CHUNKED).snapshot())
    assert fitted.prefill_context_s == 0.0
    assert fitted.fit_record.prefill_tokens_per_s == pytest.approx(4000, rel=1e-3)
    assert fitted.fit_record.chunk_size == pytest.approx(700, abs=2)
    note = fitted.observations["prefill_context_note"]
    assert isinstance(note, str)
    assert note.endswith("taken as 0"), note
    # Exact stamps: either the fitted term is ~0 +- ~0, or too small to matter.
    assert "is not told from 0" in note or f"below {CONTEXT_MIN_SHARE:.0%}" in note
    assert fitted.quality["prefill_context_residual_rel"] is None


def test_unchunked_prompts_of_several_sizes_tell_the_term():
    model = StepModel(inv_rate=1 / 250, context_s=7.5e-7, chunk=None)
    fitted = fit(drive(model, UNCHUNKED, streams=8).snapshot())
    assert fitted.fit_record.chunked is False
    assert fitted.prefill_context_s == pytest.approx(model.context_s, rel=0.03)
    assert fitted.fit_record.prefill_tokens_per_s == pytest.approx(250, rel=0.03)
    (row,) = table(fitted, 1212, 8, [512])  # the other way: chunked, from unchunked windows
    assert row.worst_gap_s == pytest.approx(worst_and_ttft(model, 1212, 8, 512), rel=0.03)


def test_an_unchunked_fit_marks_every_split_row_as_extrapolated_context():
    # Unsplit prompts show no piece after context of its own: how a piece's cost grows with
    # the context before it (against within itself) is not seen, only assumed.
    model = StepModel(inv_rate=1 / 250, context_s=7.5e-7, chunk=None)
    obs = drive(model, UNCHUNKED, streams=8)
    options = AdviceOptions(0.2, 1212, 8, chunk_sizes=(512, None))
    advice = advise(fit(obs.snapshot()), obs.snapshot(), options, None)
    assert advice["fit"]["range"]["context_tokens"] == [0, 0]
    rows = {r["chunk_size"]: r["extrapolation"] for r in advice["table"]}
    assert rows[None] == []
    assert rows[512] == [
        "steps of at most 512 prompt tokens, 600 at least seen",
        "pieces after up to 1,024 tokens of their prompt, 0 at most seen",
    ]


def test_two_prompt_sizes_cannot_tell_the_term():
    model = StepModel(inv_rate=1 / 250, context_s=7.5e-7, chunk=None)
    fitted = fit(drive(model, [1200, 800], streams=8).snapshot())
    assert fitted.prefill_context_s == 0.0
    note = fitted.observations["prefill_context_note"]
    assert isinstance(note, str)
    assert "fewer than 3 different context lengths" in note


def test_noise_without_a_context_effect_is_not_taken_for_one():
    # Steps with jitter about a linear model: not significant, or no better on the totals.
    points = [
        StepPoint(x, 0, 0.004 * x * (1 + e))
        for x, e in ((600, 0.03), (800, -0.02), (1000, 0.01), (1200, -0.03), (1400, 0.02))
    ]
    totals = [WindowTotal((p.tokens,), p.excess_s) for p in points]
    inv = sum(p.tokens * p.excess_s for p in points) / sum(p.tokens**2 for p in points)
    got = fit_context(points, totals, 0.0, inv)
    assert not got.kept
    assert got.context_s == 0.0
    assert got.inv_rate == inv
    assert got.note.endswith("taken as 0")


LLAMACPP_512_STEPS = [
    StepPoint(*step)
    for step in ((515, 0, 0.6349), (515, 515, 0.7853), (182, 1030, 0.3243), (515, 0, 0.6894),
                 (297, 515, 0.4662), (515, 0, 0.7114), (97, 515, 0.1354), (515, 0, 0.6739),
                 (397, 515, 0.6351))
]  # fmt: skip
"""A real llama.cpp fit at n_batch 512 beside 8 decoding streams (2026-12-07): each step's
tokens, context before it, and excess s."""
LLAMACPP_512_WINDOWS = [
    WindowTotal(*window)
    for window in (((36,), 0.0523), ((515, 515, 182), 1.6601), ((515, 297), 1.1129),
                   ((515, 97), 0.8054), ((515, 397), 1.2263))
]  # fmt: skip
"""The same fit's windows: each prompt's pieces and their total excess s."""


def test_a_term_the_steps_tell_is_kept_where_chunked_totals_cannot_tell_it():
    # The pieces after context cost more (515 after 515: 0.785 s against 0.635-0.711 after
    # none); the totals fit a plain rate better (1.4% against 3.6%), their context per
    # token moving too little to tell the term.
    totals = LLAMACPP_512_WINDOWS
    inv = rate_on_totals(totals, 0.0, 0.0)  # the rate without the term, as the fit has it
    got = fit_context(LLAMACPP_512_STEPS, totals, 0.0, inv)
    assert got.kept, got.note
    assert got.context_s == pytest.approx(5.26e-7, rel=0.01)
    assert got.inv_rate == pytest.approx(rate_on_totals(totals, 0.0, got.context_s))
    assert got.residual_rel is not None
    assert got.residual_rel > got.residual_without_rel  # kept on the steps, not the totals
    assert "residual 3.6%, 1.4% without it" in got.note
    # The same run's 1,212-token prompt unsplit (n_batch 2048): a worst gap of 1.954 s with
    # a decode step of 0.074 s. With the term the fit predicts it within 5%, without 12% low.
    measured = 1.954 - 0.074
    assert total_s(got.step_s, got.inv_rate, got.context_s, [1212]) == pytest.approx(
        measured, rel=0.05
    )
    assert 1212 * inv < 0.88 * measured


def test_a_term_that_leaves_the_totals_no_rate_is_dropped():
    # The same steps tell the term; windows a tenth of the real ones (the steps and the
    # windows disagree) are more than the term alone explains, so no positive rate is left
    # beside it: the term goes and the rate without it stays.
    totals = [WindowTotal(w.pieces, w.excess_s / 10) for w in LLAMACPP_512_WINDOWS]
    inv = rate_on_totals(totals, 0.0, 0.0)
    got = fit_context(LLAMACPP_512_STEPS, totals, 0.0, inv)
    assert not got.kept
    assert (got.context_s, got.inv_rate) == (0.0, inv)
    assert got.fitted_s == pytest.approx(5.26e-7, rel=0.01)  # told, then dropped
    assert "the rate on the windows' totals came out <= 0" in got.note
    assert got.note.endswith("taken as 0")


def test_the_json_and_the_printed_report_carry_the_term():
    model = StepModel()
    obs = drive(model, CHUNKED)
    fitted: Fit = fit(obs.snapshot())
    advice = advise(fitted, obs.snapshot(), AdviceOptions(0.2, 4000, 8))
    f = advice["fit"]
    assert f["prefill_context_s"] == pytest.approx(model.context_s, rel=0.02)
    assert f["observations"]["prefill_context_note"].endswith("kept")
    assert f["quality"]["prefill_context_fitted"] == pytest.approx(model.context_s, rel=0.02)
    assert f["quality"]["prefill_context_stderr"] >= 0
    text = render(advice)
    assert "a token per 1,000 tokens of context" in text


def test_the_range_the_fit_saw_and_the_extrapolated_rows():
    model = StepModel()
    obs = drive(model, CHUNKED)
    fitted = fit(obs.snapshot())
    options = AdviceOptions(0.2, 4000, 8, chunk_sizes=(512, 700, 1024, None))
    advice = advise(fitted, obs.snapshot(), options, None)
    assert advice["fit"]["range"] == {
        "prompt_tokens": [2600, 5300],
        "streams": [1, 12],
        "step_tokens": [300, 700],  # pieces of 700 and the remainders
        "context_tokens": [0, 4900],  # the last piece of 5,300
    }
    rows = {r["chunk_size"]: r["extrapolation"] for r in advice["table"]}
    assert rows[700] == []
    assert rows[512] == []  # smaller steps than seen, but not below the smallest
    assert rows[1024] == ["steps of up to 1,024 prompt tokens, 700 at most seen"]
    assert rows[None] == ["steps of up to 4,000 prompt tokens, 700 at most seen"]
    assert advice["engine"]["name"] == "llama.cpp"  # the label, with no probe
    assert advice["engine"]["probe_error"] == "not asked yet"
    text = render(advice)
    assert "fitted on prompts of 2,600-5,300 tokens, 1-12 streams decoding" in text
    assert "   1024*" in text
    assert "700*" not in text  # within range: no mark
    assert "* none: extrapolated (steps of up to 4,000 prompt tokens, 700 at most seen)" in text
    far = advise(fitted, obs.snapshot(), AdviceOptions(0.2, 9000, 30, chunk_sizes=(700,)), None)
    (row,) = far["table"]
    assert row["extrapolation"] == [
        "9,000 prompt tokens, outside the 2,600-5,300 seen",
        "30 streams decoding, outside the 1-12 seen",
        "pieces after up to 8,400 tokens of their prompt, 4,900 at most seen",
    ]
