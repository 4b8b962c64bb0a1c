"""The engine's own figures from its ground truth, checked on a planner run with exact times."""

from __future__ import annotations

import pytest

from simulator.cost import predict_seed_stutter, seed_cost_model
from simulator.observe import observe_phases, observe_stutter
from simulator.planner import SequenceSpec, StepPlanner
from simulator.records import (
    GroundTruth,
    PrefillRecord,
    Record,
    StepRecord,
    record_from_dict,
    record_to_dict,
    records_from_jsonl,
)


def spec(rid: str, prompt: int, output: int, arrival_ns: int = 0) -> SequenceSpec:
    return SequenceSpec(rid, f"x-{rid}", prompt, output, "length", arrival_ns)


def seed_run(chunk: int | None, queue_ns: int) -> list[Record]:
    """40 streams decoding; the long prompt arrives ``queue_ns`` before a step ends."""
    planner = StepPlanner(seed_cost_model(chunk))
    records: list[Record] = []
    now_ns = 0

    def step() -> None:
        nonlocal now_ns
        plan = planner.plan()
        assert plan is not None
        start_ns, now_ns = now_ns, now_ns + round(plan.duration_s * 1e9)
        result = planner.commit(plan, start_ns, now_ns)
        records.extend((result.step, *result.prefills, *result.tokens, *result.finishes))

    for i in range(40):
        planner.add(spec(f"d{i}", 1, 1000))
    while planner.num_decoding < 40:
        step()
    for _ in range(10):
        step()
    planner.add(spec("long", 4000, 3, arrival_ns=now_ns - queue_ns))
    for _ in range(12):
        step()
    return records


@pytest.mark.parametrize("chunk", [None, 512])
def test_observed_figures_match_the_prediction_on_exact_times(chunk):
    prediction = predict_seed_stutter(seed_cost_model(chunk), 40, 4000)
    observed = observe_stutter(seed_run(chunk, queue_ns=10_000_000), "x-long")
    assert observed.steady_gap_s == pytest.approx(prediction.steady_gap_s, abs=1e-9)
    assert observed.worst_gap_s == pytest.approx(prediction.worst_gap_s, abs=1e-9)
    assert observed.prefill_steps == prediction.prefill_steps
    assert observed.prefill_window_s == pytest.approx(prediction.prefill_window_s, abs=1e-8)
    assert observed.queue_s == pytest.approx(0.010)
    assert observed.ttft_s == pytest.approx(prediction.ttft_s + 0.010, abs=1e-8)


def test_worst_gap_is_the_longest_step_carrying_the_prompt():
    # The gaps overlapping arrival .. first token include the decode step the
    # prompt arrived in (25 ms); the longest is a step carrying a 512 piece (43 ms).
    records = seed_run(512, queue_ns=1)
    observed = observe_stutter(records, "x-long")
    steps = [r for r in records if isinstance(r, StepRecord)]
    carrying = [s for s in steps if "x-long" in s.prefill_x_request_ids]
    assert observed.worst_gap_s == pytest.approx(max(s.duration_s for s in carrying), abs=1e-9)


def test_observe_needs_the_prefill_and_steps_around_it():
    records = seed_run(None, queue_ns=5_000_000)
    with pytest.raises(ValueError, match="no prefill record"):
        observe_stutter(records, "x-missing")
    prefill = next(
        r for r in records if isinstance(r, PrefillRecord) and r.x_request_id == "x-long"
    )
    with pytest.raises(ValueError, match="no decode steps"):
        observe_stutter([prefill], "x-long")


def test_records_round_trip_through_jsonl():
    records = seed_run(512, queue_ns=3_000_000)
    truth = GroundTruth(limit=len(records))
    truth.extend(records)
    assert records_from_jsonl(truth.to_jsonl()) == records
    assert records_from_jsonl(truth.to_jsonl("step")) == [
        r for r in records if isinstance(r, StepRecord)
    ]
    assert all(record_from_dict(record_to_dict(r)) == r for r in records)


@pytest.mark.parametrize(
    "data",
    [{"type": "nope"}, {"step": 1}, {"type": "step", "step": 1}, {"type": "token", "extra": 1}],
)
def test_record_from_dict_rejects_what_is_no_record(data):
    with pytest.raises(ValueError):
        record_from_dict(data)


def _run(*specs: SequenceSpec) -> list[Record]:
    """Run a planner with exact step times until every request finished."""
    planner = StepPlanner(seed_cost_model(None))
    for s in specs:
        planner.add(s)
    records: list[Record] = []
    now_ns = 0
    while (plan := planner.plan()) is not None:
        start_ns, now_ns = now_ns, now_ns + round(plan.duration_s * 1e9)
        result = planner.commit(plan, start_ns, now_ns)
        records.extend((result.step, *result.prefills, *result.tokens, *result.finishes))
    return records


def test_phases_of_a_reasoning_request_from_the_records():
    records = _run(
        SequenceSpec("a", "x-a", 100, 10, "stop", 0, reasoning_tokens=4),
        SequenceSpec("b", "x-b", 100, 3, "length", 0, reasoning_tokens=5),
        SequenceSpec("c", "x-c", 100, 3, "stop", 0),
    )
    tokens = {(r.response_id, r.index): r.emit_ns for r in records if r.type == "token"}
    a = observe_phases(records, "x-a")
    assert a.ttft_s == tokens["a", 0] / 1e9
    assert a.answer_ttft_s == tokens["a", 4] / 1e9
    assert a.reasoning_s == (tokens["a", 4] - tokens["a", 0]) / 1e9
    assert (a.reasoning_tokens, a.output_tokens) == (4, 10)
    b = observe_phases(records, "x-b")  # its length ran out while it reasoned
    assert b.answer_ttft_s is None
    assert b.reasoning_s == (tokens["b", 2] - tokens["b", 0]) / 1e9
    assert b.reasoning_tokens == 3
    c = observe_phases(records, "x-c")  # no reasoning: the answer is the first token
    assert c.answer_ttft_s == c.ttft_s
    assert (c.reasoning_s, c.reasoning_tokens) == (None, 0)
    with pytest.raises(ValueError, match="x-d"):
        observe_phases(records, "x-d")
