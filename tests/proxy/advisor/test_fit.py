"""The advisor's pure core on exact stamps: the simulator's step planner driven with a fake clock.

No jitter here, so the fit must find the cost model almost exactly; the
real-time, real-socket version (with its tolerances) is
``test_advisor_validation_functional.py``.
"""

from __future__ import annotations

import pytest

from proxy.advisor.fit import fit
from proxy.advisor.observations import (
    CLEAN_PER_COUNT,
    MAX_PERIOD_GAPS,
    MAX_PROMPTS,
    MAX_STREAM_COUNTS,
    MAX_WINDOWS,
    AdvisorObservations,
)
from proxy.advisor.predict import prefill_pool, recommend, table
from proxy.advisor.report import AdviceOptions, advise, exit_status, render, typical_streams
from proxy.core.records import Backend, PrefillRecord, RequestLabels
from simulator.cost import CostModel, predict_seed_stutter
from simulator.planner import SequenceSpec, StepPlanner

BACKEND = Backend("vllm", "sim")
COST = CostModel(0.015, 0.0007, 1 / 16_000, chunk_size=700)


def drive(cost: CostModel, arrivals: list[tuple[float, int, int]]) -> AdvisorObservations:
    """Run the planner on a fake clock; feed the stamps it produces to the observations.

    ``arrivals``: (arrival s, prompt tokens, output tokens), in time order.
    """
    obs = AdvisorObservations(BACKEND)
    planner = StepPlanner(cost)
    pending = sorted(arrivals)
    last: dict[str, int] = {}
    left: dict[str, int] = {}
    now_ns = 0
    i = 0
    while i < len(pending) or left:
        while i < len(pending) and round(pending[i][0] * 1e9) <= now_ns:
            _arrival_s, prompt, output = pending[i]
            rid = f"r{i}"
            planner.add(SequenceSpec(rid, rid, prompt, output, "length", now_ns))
            obs.forwarded(rid, now_ns)
            labels = RequestLabels("chat", "m", BACKEND)
            left[rid] = output
            obs.prefill_done(PrefillRecord(rid, labels, now_ns, now_ns, prompt, 0, 0, 0.0))
            i += 1
        plan = planner.plan()
        if plan is None:
            now_ns = round(pending[i][0] * 1e9)
            continue
        end_ns = now_ns + round(plan.duration_s * 1e9)
        result = planner.commit(plan, now_ns, end_ns)
        for token in result.tokens:
            rid = token.response_id
            if token.index == 0:
                obs.first_token(rid, end_ns)
            else:
                obs.gap(rid, last[rid], end_ns)
            last[rid] = end_ns
        for finish in result.finishes:
            obs.finished(finish.response_id, end_ns)
            del left[finish.response_id]
        now_ns = end_ns
    obs.flush(now_ns + 10**9)
    return obs


def workload(prompts: list[int], streams: int = 12) -> list[tuple[float, int, int]]:
    """``streams`` short requests ending one after another; the long ``prompts`` spaced out."""
    out = [(0.0, 8, 30 + 6 * k) for k in range(streams)]
    out += [(0.5 + 0.6 * k, p, 2) for k, p in enumerate(prompts)]
    return out


def test_exact_stamps_give_the_cost_model_back():
    fitted = fit(drive(COST, workload([3100, 4500, 2600, 5300])).snapshot())
    r = fitted.fit_record
    assert fitted.missing == ()
    assert r.decode_base_s == pytest.approx(COST.decode_base_s, rel=1e-6)
    assert r.decode_per_stream_s == pytest.approx(COST.decode_per_seq_s, rel=1e-6)
    assert r.prefill_tokens_per_s == pytest.approx(1 / COST.prefill_s_per_token, rel=1e-3)
    assert r.chunked is True
    assert r.chunk_size == pytest.approx(700, abs=2)
    assert fitted.observations["prefill_windows"] == 4
    assert fitted.quality["decode_residual_rel"] == pytest.approx(0, abs=1e-9)


def test_the_table_is_the_simulators_own_prediction():
    fitted = fit(drive(COST, workload([3100, 4500, 2600, 5300])).snapshot())
    rows = table(fitted, 4000, 10, [256, 700, None])
    for row in rows:
        want = predict_seed_stutter(
            CostModel(0.015, 0.0007, 1 / 16_000, chunk_size=row.chunk_size), 10, 4000
        )
        assert row.worst_gap_s == pytest.approx(want.worst_gap_s, rel=1e-3)
        assert row.rate_during_prefill_per_s == pytest.approx(
            want.token_rate_during_prefill_per_s, rel=1e-3
        )
        # The model's TTFT adds the expected wait for the running step: half of one.
        assert row.ttft_s == pytest.approx(want.ttft_s + want.steady_gap_s / 2, rel=1e-3)
    rec = recommend(fitted, rows, itl_target_s=0.080)
    assert rec.fits
    assert rec.row is not None
    assert rec.row.chunk_size == 700
    assert rec.next_larger is not None
    assert rec.next_larger.chunk_size is None
    pool = prefill_pool(fitted, 4000, 10, kv_transfer_s=0.02)
    assert pool.worst_gap_s == pytest.approx(0.015 + 0.007, rel=1e-3)
    assert pool.ttft_s == pytest.approx(0.015 + 4000 / 16_000 + 0.02, rel=1e-3)


def test_unchunked_prefill_is_found_unchunked():
    cost = CostModel(0.02, 0.0005, 1 / 25_000, chunk_size=None)
    fitted = fit(drive(cost, workload([3000, 5000, 4000])).snapshot())
    r = fitted.fit_record
    assert r.chunked is False
    assert r.chunk_size is None
    assert fitted.observations["largest_unsplit_prompt_tokens"] == 5000
    assert r.prefill_tokens_per_s == pytest.approx(25_000, rel=1e-3)


def test_a_light_backend_fits_the_prefill_from_first_tokens():
    # Streams that never overlap a prompt: the prefill shows only in TTFT on an idle engine.
    cost = CostModel(0.02, 0.0005, 1 / 25_000, chunk_size=None)
    arrivals = [(0.0, 8, 20), (0.0, 8, 30), (1.0, 3000, 2), (1.5, 6000, 2)]
    fitted = fit(drive(cost, arrivals).snapshot())
    assert fitted.observations["prefill_windows_alone"] == 2
    assert fitted.fit_record.prefill_tokens_per_s == pytest.approx(25_000, rel=1e-3)
    assert fitted.fit_record.chunked is None  # never seen while streams decode
    assert any("chunked" in m for m in fitted.missing)


def test_one_stream_count_says_what_is_missing():
    fitted = fit(drive(COST, [(0.0, 8, 40)]).snapshot())
    assert fitted.fit_record.decode_base_s is None
    assert fitted.fit_record.prefill_tokens_per_s is None
    assert "two or more different numbers of decoding streams (seen only at 1)" in (
        " ".join(fitted.missing)
    )


def test_no_traffic_says_what_is_missing():
    fitted = fit(AdvisorObservations(BACKEND).snapshot(0))
    assert fitted.missing[0].startswith("decode gaps with no prefill going on: 0 seen")


def test_short_prompts_only_say_no_long_prompts():
    arrivals = [(0.0, 8, 30 + 6 * k) for k in range(8)] + [(0.5, 10, 2), (0.9, 12, 2)]
    fitted = fit(drive(COST, arrivals).snapshot())
    assert fitted.fit_record.decode_base_s is not None
    assert fitted.fit_record.prefill_tokens_per_s is None
    assert "no long prompts yet?" in " ".join(fitted.missing)


def test_memory_stays_bounded():
    obs = AdvisorObservations(BACKEND)
    labels = RequestLabels("chat", "m", BACKEND)
    t = 0
    for k in range(3000):  # requests forever overlapping: one endless busy period
        rid = f"r{k}"
        obs.forwarded(rid, t)
        obs.prefill_done(PrefillRecord(rid, labels, t, t, 100, 0, 0, 0.0))
        for j in range(10):
            obs.gap(f"s{j}", t, t + 1000)
        t += 1000
        obs.first_token(f"r{k - 1}", t)
        # The period never closes: it keeps nothing per request it saw (the soak's leak).
        assert obs.tracked["period_open_windows"] <= 2
        assert k == 0 or obs.tracked["period_gaps"] == 0
    for k in range(20_000):  # then clean gaps at ever more stream counts
        obs.first_token(f"x{k}", t)
        obs.gap(f"x{k}", t, t + 5)
        t += 10
    for j in range(600):
        obs.forwarded(f"w{j}", t)
        obs.first_token(f"w{j}", t + 1)
        t += 10**8
        obs.gap("x1", t - 10, t)
    sizes = obs.tracked
    snap = obs.snapshot(t)
    assert sizes["period_gaps"] <= MAX_PERIOD_GAPS
    assert sizes["clean_gaps"] <= CLEAN_PER_COUNT * 512
    assert sizes["prompts"] <= MAX_PROMPTS
    assert sizes["stream_counts"] <= MAX_STREAM_COUNTS
    assert len(snap.windows) <= MAX_WINDOWS
    assert len(snap.clean_gaps_ns) <= 512


def test_defaults_capacity_and_the_json_of_advise():
    obs = drive(COST, workload([3100, 4500, 2600, 5300]))
    snapshot = obs.snapshot()
    fitted = fit(snapshot)
    # No usage records in this drive: the sizes are the prefill records' estimates only,
    # so the deployment's p95 needs finished requests (and says so).
    advice = advise(fitted, snapshot, AdviceOptions(tpot_target_s=0.05))
    assert advice["status"] == "not enough data"
    assert any("known prompt size" in m for m in advice["missing"])
    assert advice["table"] == []
    given = advise(fitted, snapshot, AdviceOptions(0.05, prompt_tokens=4000))
    assert given["status"] == "ok"
    # The typical number of decoding streams: the median over decode steps.
    assert given["scenario"]["streams"] == typical_streams(snapshot)
    assert 4 <= given["scenario"]["streams"] <= 12
    cap = given["capacity"]
    # (target - base) / per_stream = 50, floored: 49 or 50 as the fit's last digits fall.
    assert cap["streams"] in (49, 50)
    assert cap["prefill_load_tokens_per_s"] == 0.0  # no finished request seen
    rec = given["recommendation"]
    assert rec["largest_chunk_within_target"] == pytest.approx(
        (0.05 - 0.015 - 0.0007 * given["scenario"]["streams"]) * 16_000, abs=2
    )
    assert [r["chunk_size"] for r in given["table"]] == [256, 512, 1024, 2048, 4096, 8192, None]
    assert "recommended:" in render(given)
    assert exit_status([given]) == 0
    assert exit_status([advice]) == 3


def test_a_stream_read_just_before_the_first_token_is_a_reference():
    # llama.cpp emits the last prefill step's tokens together; the proxy may read the other
    # streams' a few ms before the culprit's first token, and their next step only after the
    # period's margin: they still saw every step of the prefill.
    obs = AdvisorObservations(BACKEND)
    ms = 1_000_000
    for s in ("a", "b"):
        obs.first_token(s, 0)
    t = 0
    for _ in range(10):
        for s in ("a", "b"):
            obs.gap(s, t, t + 100 * ms)
        t += 100 * ms
    obs.forwarded("long", t + 10 * ms)
    for s in ("a", "b"):
        obs.gap(s, t, t + 2000 * ms)  # the prefill step, read 3 ms before the first token
    obs.first_token("long", t + 2003 * ms)
    for s in ("a", "b"):
        obs.gap(s, t + 2000 * ms, t + 2100 * ms)  # the next step: past the margin
    (window,) = obs.snapshot(t + 3000 * ms).windows
    assert window.decoding_at_start == 2
    assert len(window.references) == 2


class _StepCost(CostModel):
    """The simulator's model plus a fixed cost in every step that carries prefill."""

    __slots__ = ()
    EXTRA_S = 0.040

    def step_s(self, decode_batch: int, prefill_tokens: int) -> float:
        extra = self.EXTRA_S if prefill_tokens else 0.0
        return super().step_s(decode_batch, prefill_tokens) + extra


def test_the_simulator_has_no_fixed_cost_per_prefill_step():
    fitted = fit(drive(COST, workload([3100, 4500, 2600, 5300])).snapshot())
    assert fitted.prefill_step_s == pytest.approx(0, abs=1e-6)
    assert fitted.fit_record.prefill_tokens_per_s == pytest.approx(16_000, rel=1e-3)


def test_a_fixed_cost_per_prefill_step_is_fitted_and_predicted():
    cost = _StepCost(0.015, 0.0007, 1 / 16_000, chunk_size=700)
    fitted = fit(drive(cost, workload([3100, 4500, 2600, 5300])).snapshot())
    r = fitted.fit_record
    assert fitted.prefill_step_s == pytest.approx(0.040, rel=1e-3)
    assert r.prefill_tokens_per_s == pytest.approx(16_000, rel=1e-3)
    assert r.chunk_size == pytest.approx(700, abs=2)
    step_note = fitted.observations["prefill_step_note"]
    assert isinstance(step_note, str)
    assert step_note.endswith("; kept"), step_note
    assert "is told from 0" in step_note
    # Two windows alone (the dearer prefills overlap the next prompt): a full and a last piece
    # of each.
    assert fitted.observations["prefill_windows"] == 2
    assert fitted.observations["prefill_steps"] == 4
    assert fitted.observations["prefill_step_tokens"] == [300, 700]
    (row,) = table(fitted, 4000, 10, [None])
    assert row.worst_gap_s == pytest.approx(0.015 + 0.007 + 0.040 + 4000 / 16_000, rel=1e-3)
    (row,) = table(fitted, 4000, 10, [700])
    assert row.ttft_s == pytest.approx(6 * (0.022 + 0.040) + 4000 / 16_000 + 0.011, rel=1e-3)


def test_prompts_in_one_piece_size_leave_the_step_cost_at_0_and_say_why():
    # Every prompt 2 pieces of 700 and a remainder of 300: the steps cannot tell a fixed cost
    # from the rate (the last piece always 300 tokens).
    cost = _StepCost(0.015, 0.0007, 1 / 16_000, chunk_size=700)
    fitted = fit(drive(cost, workload([1700, 1700, 1700])).snapshot())
    assert fitted.prefill_step_s == 0.0
    note = fitted.observations["prefill_step_note"]
    assert isinstance(note, str)
    assert note.endswith("taken as 0")
    advice = advise(fitted, drive(cost, workload([1700])).snapshot(), AdviceOptions(0.05, 4000, 8))
    assert advice["fit"]["prefill_step_s"] == 0.0
