"""The seed's techniques in the pure planner, step by step on a fake clock."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest

from simulator.cost import seed_cost_model
from simulator.disaggregated import DisaggregatedPlanner
from simulator.planner import SequenceSpec, StepPlanner, StepResult
from simulator.profile import BUILTIN_PROFILES, profile_from_mapping, profile_to_mapping
from simulator.techniques import (
    Disaggregated,
    KvBudget,
    Speculative,
    StaticBatching,
    Techniques,
)

COST = seed_cost_model(None)


def spec(rid: str, prompt: int, output: int = 1000, arrival_ns: int = 0) -> SequenceSpec:
    return SequenceSpec(rid, f"x-{rid}", prompt, output, "length", arrival_ns)


class Clock:
    """Steps one planner (one pool) with times taken from its plans: a fake, exact clock."""

    def __init__(self, planner: StepPlanner, now_ns: int = 0) -> None:
        self.planner = planner
        self.now_ns = now_ns

    def step(self) -> StepResult:
        plan = self.planner.plan(self.now_ns)
        assert plan is not None
        start = self.now_ns
        self.now_ns += round(plan.duration_s * 1e9)
        return self.planner.commit(plan, start, self.now_ns)


def warm(planner: StepPlanner, clock: Clock, n: int, output: int = 1000) -> None:
    for i in range(n):
        planner.add(spec(f"d{i}", 1, output))
    while planner.num_decoding < n:
        clock.step()


# --- speculative decoding -------------------------------------------------------------

SPEC = Speculative(draft_tokens=4, acceptance_rate=0.7, seed=7)


def per_sequence_tokens(result: StepResult) -> Counter[str]:
    return Counter(t.response_id for t in result.tokens)


def test_speculative_step_emits_one_plus_accepted_tokens_at_a_little_more_cost():
    planner = StepPlanner(COST, techniques=Techniques(speculative=SPEC))
    clock = Clock(planner)
    warm(planner, clock, 40)
    counts: list[int] = []
    for _ in range(50):
        result = clock.step()
        step = result.step
        # The step's cost: a plain decode of 40, plus drafting k tokens and checking 40 x k.
        assert step.duration_s == pytest.approx(COST.decode_s(40) + 4 * 0.0005 + 40 * 4 * 1e-5)
        assert step.drafted_tokens == 40 * 4
        per_seq = per_sequence_tokens(result)
        assert set(per_seq.values()) <= {1, 2, 3, 4, 5}
        assert sum(per_seq.values()) == 40 + step.accepted_tokens
        # All tokens of one step leave together, at its end.
        assert {t.emit_ns for t in result.tokens} == {step.end_ns}
        counts.extend(per_seq.values())
    # 2,000 draws of a variable whose standard deviation is ~1.3: the mean is known to +-0.1.
    assert statistics.mean(counts) == pytest.approx(SPEC.expected_tokens_per_step(), abs=0.1)
    # "A little more than a plain step": drafting and checking add under a fifth.
    assert 0 < SPEC.extra_s(40) < 0.2 * COST.decode_s(40)


def test_speculative_is_reproducible_and_respects_the_output_length():
    def run(seed: int) -> list[tuple[str, int, int]]:
        speculative = Speculative(draft_tokens=3, acceptance_rate=0.8, seed=seed)
        planner = StepPlanner(COST, techniques=Techniques(speculative=speculative))
        clock = Clock(planner)
        for i in range(5):
            planner.add(spec(f"r{i}", 10, output=37))
        tokens: list[tuple[str, int, int]] = []
        while planner.num_running or planner.num_waiting:
            tokens.extend((t.response_id, t.index, t.step) for t in clock.step().tokens)
        return tokens

    first = run(1)
    assert first == run(1)
    assert first != run(2)
    for i in range(5):
        indices = [index for rid, index, _ in first if rid == f"r{i}"]
        assert indices == list(range(37))


@pytest.mark.parametrize(("rate", "tokens"), [(0.0, 1), (1.0, 5)])
def test_speculative_acceptance_extremes(rate, tokens):
    speculative = Speculative(draft_tokens=4, acceptance_rate=rate)
    planner = StepPlanner(COST, techniques=Techniques(speculative=speculative))
    clock = Clock(planner)
    warm(planner, clock, 3)
    assert set(per_sequence_tokens(clock.step()).values()) == {tokens}


def test_speculative_leaves_prefill_alone():
    planner = StepPlanner(COST, techniques=Techniques(speculative=SPEC))
    clock = Clock(planner)
    planner.add(spec("long", 4000))
    result = clock.step()
    # A prefill-only step decodes nobody, so drafts nothing: it costs what a plain one does.
    assert result.step.duration_s == pytest.approx(COST.step_s(0, 4000))
    assert [t.index for t in result.tokens] == [0]


# --- KV budget --------------------------------------------------------------------------


def test_kv_budget_bounds_the_batch_and_queues_the_rest():
    budget = KvBudget(capacity_tokens=8192, tokens_per_seq=2048)
    planner = StepPlanner(COST, techniques=Techniques(kv_budget=budget))
    clock = Clock(planner)
    for i in range(6):
        planner.add(spec(f"r{i}", 10, output=6 if i == 0 else 50))
    results = [clock.step() for _ in range(5)]
    assert planner.num_running == 4
    assert planner.num_waiting == 2
    assert results[3].step.kv_tokens_used == 4 * 2048
    assert results[3].step.waiting == 2
    # r0 finishes (6 tokens), which frees one cache: r4 is admitted next.
    while planner.phase("r0") is not None:
        clock.step()
    assert clock.step().step.prefill_response_ids == ("r4",)
    assert planner.num_running == 4
    assert planner.num_waiting == 1


def test_a_smaller_cache_per_sequence_fits_more_sequences_and_more_tokens_per_second():
    def tokens_per_s(tokens_per_seq: int) -> tuple[int, float]:
        budget = KvBudget(capacity_tokens=64 * 1024, tokens_per_seq=tokens_per_seq)
        planner = StepPlanner(COST, techniques=Techniques(kv_budget=budget))
        clock = Clock(planner)
        for i in range(40):
            planner.add(spec(f"r{i}", 1, output=100))
        batches, tokens = [], 0
        for _ in range(100):
            result = clock.step()
            batches.append(result.step.decode_batch)
            tokens += len(result.tokens)
        return max(batches), tokens / (clock.now_ns / 1e9)

    full_batch, full_rate = tokens_per_s(2048)  # 32 caches fit
    half_batch, half_rate = tokens_per_s(1024)  # 64 fit: all 40 run
    assert (full_batch, half_batch) == (32, 40)
    # 40 / decode(40) against 32 / decode(32): 1.22x the tokens per second.
    expected = (40 / COST.decode_s(40)) / (32 / COST.decode_s(32))
    assert half_rate / full_rate == pytest.approx(expected, rel=0.05)


# --- static batching --------------------------------------------------------------------


def test_static_batching_waits_for_the_batch_to_fill_then_prefills_it_in_one_step():
    static = StaticBatching(fill_s=0.1)
    planner = StepPlanner(COST, techniques=Techniques(static_batching=static))
    planner.add(spec("a", 100, output=3, arrival_ns=0))
    assert planner.plan(50_000_000) is None
    assert planner.next_admission_ns() == 100_000_000
    planner.add(spec("b", 200, output=5, arrival_ns=60_000_000))
    clock = Clock(planner, now_ns=100_000_000)
    first = clock.step()
    assert first.step.prefill_response_ids == ("a", "b")
    assert first.step.duration_s == pytest.approx(COST.step_s(0, 300))
    assert sorted(t.response_id for t in first.tokens) == ["a", "b"]
    # A request arriving now waits for the whole batch, not just for a free slot.
    c_arrival_ns = clock.now_ns
    planner.add(spec("c", 10, output=2, arrival_ns=c_arrival_ns))
    decode_batches = []
    while planner.phase("b") is not None:
        result = clock.step()
        assert result.step.prefill_tokens == 0
        assert result.step.waiting == 1
        decode_batches.append(result.step.decode_batch)
    assert decode_batches == [2, 2, 1, 1]
    assert planner.phase("c") is not None
    # The batch took less than c's fill window: c's batch forms when that is over.
    assert clock.now_ns < c_arrival_ns + 100_000_000
    assert planner.plan(clock.now_ns) is None
    assert planner.next_admission_ns() == c_arrival_ns + 100_000_000
    clock.now_ns = c_arrival_ns + 100_000_000
    assert clock.step().step.prefill_response_ids == ("c",)


def test_static_batching_decodes_like_continuous_batching():
    static = Techniques(static_batching=StaticBatching(fill_s=0.0))
    for techniques in (static, Techniques()):
        planner = StepPlanner(COST, techniques=techniques)
        clock = Clock(planner)
        warm(planner, clock, 40)
        assert clock.step().step.duration_s == pytest.approx(COST.decode_s(40))


# --- disaggregated prefill and decode -------------------------------------------------------


def test_disaggregated_decode_steps_never_carry_prefill():
    transfer = Disaggregated(kv_transfer_s_per_token=5e-6)
    planner = DisaggregatedPlanner(COST, None, Techniques(disaggregated=transfer))
    prefill = Clock(planner.prefill)
    decode = Clock(planner.decode)
    for i in range(40):
        planner.add(spec(f"d{i}", 64))
    while planner.prefill.num_running or planner.prefill.num_waiting:
        result = prefill.step()
        assert result.step.pool == "prefill"
        assert result.step.decode_batch == 0
        (handoff,) = result.handoffs
        assert handoff.emitted == 1
    assert planner.decode.num_waiting == 40
    decode.now_ns = prefill.now_ns
    first = decode.step()
    assert first.step.decode_batch == 40
    start_ns = decode.now_ns
    planner.add(spec("long", 4000, output=4, arrival_ns=start_ns))
    plan = planner.prefill.plan(start_ns)
    assert plan is not None
    # The prefill pool's step: the prompt alone, then its KV sent; the first token with it.
    assert plan.duration_s == pytest.approx(COST.step_s(0, 4000) + 4000 * 5e-6)
    end_ns = start_ns + round(plan.duration_s * 1e9)
    # Meanwhile the decode pool keeps stepping at decode(40), untouched by the prompt.
    during = []
    while decode.now_ns < end_ns:
        during.append(decode.step())
    assert len(during) == math.ceil(plan.duration_s / COST.decode_s(40))
    assert {(s.step.decode_batch, s.step.prefill_tokens) for s in during} == {(40, 0)}
    assert [s.step.duration_s for s in during] == pytest.approx([COST.decode_s(40)] * len(during))
    long_step = planner.prefill.commit(plan, start_ns, end_ns)
    (record,) = long_step.prefills
    assert record.transfer_s == pytest.approx(0.02)
    assert [(t.index, t.emit_ns) for t in long_step.tokens] == [(0, end_ns)]
    # The newcomer joins the decode pool's next step and decodes its 3 more tokens there.
    after = [decode.step() for _ in range(3)]
    assert all(s.step.pool == "decode" and s.step.prefill_tokens == 0 for s in after)
    assert [s.step.decode_batch for s in after] == [41, 41, 41]
    assert [t.index for s in after for t in s.tokens if t.response_id == "long"] == [1, 2, 3]
    assert planner.phase("long") is None
    assert planner.num_decoding == 40


def test_disaggregated_abort_and_phase_reach_both_pools():
    planner = DisaggregatedPlanner(COST, None, Techniques(disaggregated=Disaggregated()))
    planner.add(spec("a", 10))
    planner.add(spec("b", 10))
    Clock(planner.prefill).step()
    assert planner.phase("a") is not None
    assert planner.phase("b") is not None
    assert planner.abort("a", 1) is not None
    assert planner.abort("b", 1) is not None
    assert planner.num_running == planner.num_waiting == 0
    with pytest.raises(ValueError, match="disaggregated"):
        DisaggregatedPlanner(COST, None, Techniques())


# --- profiles ---------------------------------------------------------------------------------


def test_techniques_round_trip_through_a_profile_file():
    techniques = Techniques(
        speculative=SPEC,
        kv_budget=KvBudget(capacity_tokens=65536, tokens_per_seq=1024),
        disaggregated=Disaggregated(kv_transfer_s_per_token=1e-6),
    )
    profile = BUILTIN_PROFILES["seed"].with_overrides(techniques=techniques)
    assert profile_from_mapping(profile_to_mapping(profile)) == profile
    assert profile_from_mapping(profile_to_mapping(BUILTIN_PROFILES["seed"])).techniques == (
        Techniques()
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"speculative": {"draft_tokens": 0}}, "speculative.draft_tokens"),
        ({"speculative": {"acceptance_rate": 1.5}}, "speculative.acceptance_rate"),
        ({"speculative": {"k": 4}}, "speculative.k: unknown key"),
        ({"kv_budget": {"capacity_tokens": 100, "tokens_per_seq": 200}}, "does not fit"),
        ({"kv_budget": 3}, "kv_budget: expected an object"),
        ({"static_batching": True, "disaggregated": True}, "choose one"),
        ({"disaggregated": {"kv_transfer_s_per_token": -1}}, "kv_transfer_s_per_token"),
    ],
)
def test_bad_technique_settings_name_the_key(extra, message):
    base = profile_to_mapping(BUILTIN_PROFILES["seed"])
    with pytest.raises(ValueError, match=message):
        profile_from_mapping({**base, **extra})
