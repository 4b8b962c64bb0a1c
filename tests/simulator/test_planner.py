"""The pure step planner: scheduling checked step by step with made-up times."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cost import CostModel, predict_seed_stutter, seed_cost_model
from simulator.planner import Phase, SequenceSpec, StepPlanner, StepResult
from simulator.tokens import BLOCK_TOKENS, PrefixCache, block_hashes, fit_tokens, text_tokens

ROOT = Path(__file__).parents[2]


def spec(rid: str, prompt: int, output: int = 1000, hashes: tuple[bytes, ...] = ()):
    return SequenceSpec(rid, f"x-{rid}", prompt, output, "length", 0, hashes)


class Clock:
    """Drives a planner with step times taken from the plans (a fake, exact clock)."""

    def __init__(self, planner: StepPlanner) -> None:
        self.planner = planner
        self.now_ns = 0

    def step(self) -> StepResult:
        plan = self.planner.plan()
        assert plan is not None
        start = self.now_ns
        self.now_ns += round(plan.duration_s * 1e9)
        return self.planner.commit(plan, start, self.now_ns)


def warm(planner: StepPlanner, clock: Clock, n: int) -> None:
    """Get ``n`` one-token-prompt sequences decoding."""
    for i in range(n):
        planner.add(spec(f"d{i}", 1))
    while planner.num_decoding < n:
        clock.step()


@pytest.mark.parametrize("chunk", [None, 512])
def test_long_prompt_during_40_decodes_matches_prediction(chunk):
    cost = seed_cost_model(chunk)
    planner = StepPlanner(cost)
    clock = Clock(planner)
    warm(planner, clock, 40)
    planner.add(spec("long", 4000, output=3))
    steps: list[StepResult] = []
    while True:
        result = clock.step()
        steps.append(result)
        if result.prefills:
            break
    prediction = predict_seed_stutter(cost, 40, 4000)
    assert len(steps) == prediction.prefill_steps
    assert all(s.step.decode_batch == 40 for s in steps)
    assert sum(s.step.prefill_tokens for s in steps) == 4000
    durations = [s.step.duration_s for s in steps]
    assert max(durations) == pytest.approx(prediction.worst_gap_s)
    # Every existing stream emits exactly one token per step, also during the prefill.
    for s in steps:
        assert sorted(t.response_id for t in s.tokens if t.response_id != "long") == sorted(
            f"d{i}" for i in range(40)
        )
    (prefill,) = steps[-1].prefills
    ttft_ns = prefill.end_ns - prefill.start_ns
    assert ttft_ns / 1e9 == pytest.approx(prediction.ttft_s, abs=1e-6)
    assert prefill.steps == prediction.prefill_steps
    first = [t for t in steps[-1].tokens if t.response_id == "long"]
    assert [t.index for t in first] == [0]
    assert first[0].emit_ns == prefill.end_ns
    # Next step: the new sequence decodes with the others.
    assert clock.step().step.decode_batch == 41


def test_chunked_pieces_are_fifo_across_prompts():
    planner = StepPlanner(CostModel(0.01, 0.001, 0.0001, chunk_size=512))
    clock = Clock(planner)
    planner.add(spec("a", 700))
    planner.add(spec("b", 300))
    planner.add(spec("c", 100))
    r0 = clock.step()
    assert r0.step.prefill_response_ids == ("a",)
    assert r0.step.prefill_tokens == 512
    r1 = clock.step()
    # a's remaining 188, then b's 300, then 24 of c.
    assert r1.step.prefill_response_ids == ("a", "b", "c")
    assert r1.step.prefill_tokens == 512
    assert [p.response_id for p in r1.prefills] == ["a", "b"]
    assert r1.step.prefill_x_request_ids == ("x-a", "x-b", "x-c")
    r2 = clock.step()
    assert r2.step.prefill_tokens == 76
    assert r2.step.decode_batch == 2
    assert [p.response_id for p in r2.prefills] == ["c"]
    assert r2.prefills[0].start_ns == r1.step.start_ns
    assert r2.prefills[0].steps == 2


def test_unchunked_admits_one_prompt_per_step_in_fifo_order():
    planner = StepPlanner(CostModel(0.01, 0.001, 0.0001))
    clock = Clock(planner)
    for rid in ("a", "b", "c"):
        planner.add(spec(rid, 50))
    order = [clock.step().step.prefill_response_ids for _ in range(4)]
    assert order == [("a",), ("b",), ("c",), ()]
    assert planner.phase("a") is Phase.DECODING
    assert planner.plan() is not None


def test_max_num_seqs_holds_requests_back_until_one_finishes():
    planner = StepPlanner(CostModel(0.01, 0.001, 0.0001, max_num_seqs=2))
    clock = Clock(planner)
    planner.add(spec("a", 10, output=2))
    planner.add(spec("b", 10, output=5))
    planner.add(spec("c", 10, output=1))
    clock.step()  # a prefills
    clock.step()  # b prefills, a decodes its 2nd and last token
    assert planner.num_running == 1
    assert planner.phase("c") is Phase.WAITING
    r = clock.step()  # room again: c is admitted
    assert r.step.prefill_response_ids == ("c",)
    assert [f.response_id for f in r.finishes] == ["c"]


def test_max_num_seqs_bounds_the_batch_chunked():
    planner = StepPlanner(CostModel(0.01, 0.001, 0.0001, chunk_size=4096, max_num_seqs=3))
    clock = Clock(planner)
    for i in range(5):
        planner.add(spec(f"r{i}", 10))
    r = clock.step()
    assert r.step.prefill_response_ids == ("r0", "r1", "r2")
    assert planner.num_running == 3
    assert planner.num_waiting == 2


def test_finish_after_output_tokens_and_idle():
    planner = StepPlanner(CostModel(0.01, 0.001, 0.0001))
    clock = Clock(planner)
    planner.add(spec("a", 10, output=3))
    results = [clock.step() for _ in range(3)]
    assert [t.index for r in results for t in r.tokens] == [0, 1, 2]
    (finish,) = results[-1].finishes
    assert finish.finish_reason == "length"
    assert finish.output_tokens == 3
    assert finish.x_request_id == "x-a"
    assert planner.plan() is None


def test_abort_shrinks_the_batch_and_drops_in_flight_tokens():
    planner = StepPlanner(CostModel(0.01, 0.001, 0.0001))
    clock = Clock(planner)
    warm(planner, clock, 3)
    plan = planner.plan()
    assert plan is not None
    assert plan.decode_batch == 3
    record = planner.abort("d1", now_ns=5)
    assert record is not None
    assert record.finish_reason == "abort"
    result = planner.commit(plan, 0, 1)
    assert {t.response_id for t in result.tokens} == {"d0", "d2"}
    assert clock.step().step.decode_batch == 2
    assert planner.abort("d1", now_ns=6) is None
    planner.add(spec("w", 5))
    assert planner.abort("w", now_ns=7) is not None
    assert planner.num_waiting == 0


def test_prefix_cache_hit_skips_prefill():
    cache = PrefixCache()
    planner = StepPlanner(CostModel(0.01, 0.001, 0.0001), cache)
    clock = Clock(planner)
    tokens = fit_tokens(text_tokens("You are a helpful assistant. " * 40), 1000)
    hashes = block_hashes(tokens)
    assert len(hashes) == 1000 // BLOCK_TOKENS
    planner.add(spec("first", 1000, output=1, hashes=hashes))
    miss = clock.step()
    assert miss.step.prefill_tokens == 1000
    assert miss.prefills[0].cached_tokens == 0
    planner.add(spec("again", 1000, output=1, hashes=hashes))
    hit = clock.step()
    cached = (1000 - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert hit.prefills[0].cached_tokens == cached
    assert hit.step.prefill_tokens == 1000 - cached
    assert hit.step.duration_s < miss.step.duration_s
    # A prompt sharing only the first blocks hits those only.
    other = block_hashes([*tokens[:100], *("zz" for _ in range(900))])
    planner.add(spec("partial", 1000, output=1, hashes=other))
    partial = clock.step()
    assert partial.prefills[0].cached_tokens == 96


def test_full_hit_still_computes_the_last_token():
    cache = PrefixCache()
    hashes = block_hashes([str(i) for i in range(64)])
    cache.insert(hashes)
    assert cache.match(hashes, 64) == 48
    assert cache.match(hashes, 65) == 64
    assert cache.match(hashes[:1], 64) == 16


def test_planner_misuse_fails_loudly():
    planner = StepPlanner(CostModel(0.01, 0.001, 0.0001))
    planner.add(spec("a", 10))
    with pytest.raises(ValueError, match="duplicate"):
        planner.add(spec("a", 10))
    plan = planner.plan()
    assert plan is not None
    with pytest.raises(RuntimeError, match="not committed"):
        planner.plan()
    with pytest.raises(ValueError, match=">= 1"):
        planner.add(spec("b", 0))


def test_core_modules_import_no_asyncio_or_aiohttp():
    code = (
        "import sys\n"
        "import simulator.cost, simulator.planner, simulator.profile, simulator.tokens\n"
        "import simulator.records, simulator.openai_format\n"
        "bad = sorted(m for m in ('asyncio', 'aiohttp') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""
