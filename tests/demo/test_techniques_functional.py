"""`tokenstamp demo --techniques --json` end to end: each of the seed's claims, checked twice.

Every claim is checked on what the proxy measured (the row) and on what the
simulated engine recorded (the row's ``engine``: its ground truth, same clock).
The engine's figures are the cost model's within a timer's overshoot, so those
checks are tight; the proxy's add delivery (writing, reading and stamping a
step's tokens, the request's trip through the proxy) and whatever the machine's
load does to three processes, so those use the tolerances of :mod:`demo.claims`,
each of which says where it comes from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from demo.claims import DECODE_TOLERANCE, DELIVERY_S, ORDER
from demo.techniques import LONG_PROMPT, SHARED_PREFIX, STREAMS
from simulator.cost import seed_cost_model
from simulator.techniques import Disaggregated, Speculative

COST = seed_cost_model(None)
STEP_S = COST.decode_s(STREAMS)
"""The baseline's decode step: 40 streams, 25 ms."""
TIMER_S = 0.002
"""A modelled step as the engine records it: the event loop's timer overshoot."""
FIELDS = (
    "name", "ttft_p50_s", "ttft_p99_s", "tpot_s", "worst_gap_s", "tokens_per_s",
    "tokens_per_event", "prefill_stalls", "stutter_cost_s", "claim", "held",
)  # fmt: skip

_RUNS: list[dict] = []


def _run_demo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pictures = tmp_path_factory.mktemp("technique-pictures")
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "demo", "--techniques", "--json", "--out",
         str(pictures)],
        capture_output=True, text=True, timeout=280, check=True,
    )  # fmt: skip
    results = json.loads(out.stdout)
    results["out"] = str(pictures)
    return results


@pytest.fixture
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One demo run shared by this module's tests; a retried test measures again."""
    retry = getattr(request.node, "execution_count", 1) > 1
    if retry or not _RUNS:
        _RUNS[:] = [_run_demo(tmp_path_factory)]
    return _RUNS[0]


def rows(results: dict) -> dict[str, dict]:
    return {row["name"]: row for row in results["techniques"]}


@pytest.mark.timeout(300)
def test_one_row_per_technique_with_the_issue_fields(results):
    assert [row["name"] for row in results["techniques"]] == list(ORDER)
    for row in results["techniques"]:
        assert set(FIELDS) <= row.keys()
        assert isinstance(row["held"], bool)
        assert row["claim"]


@pytest.mark.timeout(300)
def test_every_claim_held(results):
    failed = {row["name"]: row["evidence"] for row in results["techniques"] if not row["held"]}
    assert failed == {}


@pytest.mark.timeout(300)
def test_baseline_stutters(results):
    base = rows(results)["baseline"]
    # Each of the 3 prompts stalls each of the 40 streams once (a stream may just have ended).
    assert base["prefill_stalls"] >= 0.9 * 3 * STREAMS
    assert base["stutter_cost_s"] > 0
    assert base["engine"]["prefill_in_decode_steps"] == 3
    # The worst gap is the step that carries a 16,000-token prefill (and decodes 40 or 41).
    assert base["engine"]["worst_step_s"] == pytest.approx(
        COST.step_s(STREAMS, LONG_PROMPT), abs=0.001
    )
    assert abs(base["worst_gap_s"] - COST.step_s(STREAMS, LONG_PROMPT)) <= DELIVERY_S + TIMER_S


@pytest.mark.timeout(300)
def test_prefix_reuse_cuts_ttft_tenfold_and_leaves_decode_alone(results):
    r = rows(results)
    base, reuse = r["baseline"], r["prefix_reuse"]
    # Engine: two of the three prompts find the shared prefix cached and compute 64 tokens.
    assert reuse["engine"]["cached_tokens"] == SHARED_PREFIX
    assert base["engine"]["ttft_p50_s"] / reuse["engine"]["ttft_p50_s"] >= 10
    # (The same 40 streams, sometimes one prompt more: decode(40) or decode(41).)
    assert reuse["engine"]["decode_step_s"] == pytest.approx(
        base["engine"]["decode_step_s"], rel=0.01
    )
    # Proxy: TTFT p50 down at least 10x, the decode step within 5%, TPOT not up (the
    # stalls of the cached prompts are gone, so the streams' TPOT falls, if anything).
    assert base["ttft_p50_s"] / reuse["ttft_p50_s"] >= 10
    assert abs(reuse["decode_step_s"] - base["decode_step_s"]) <= DECODE_TOLERANCE * STEP_S
    assert reuse["tpot_s"] <= base["tpot_s"] * (1 + DECODE_TOLERANCE)
    # The first prompt with the prefix pays in full: p99 stays.
    assert reuse["ttft_p99_s"] >= 0.8 * base["ttft_p99_s"]


@pytest.mark.timeout(300)
def test_speculative_decoding_attacks_decode(results):
    r = rows(results)
    base, spec = r["baseline"], r["speculative"]
    draft = Speculative()
    # Engine: ~2.8 tokens per sequence per step (thousands of draws: +-0.1), at a step that
    # costs a little more: decode(40) plus drafting and checking.
    assert spec["engine"]["tokens_per_step"] == pytest.approx(
        draft.expected_tokens_per_step(), abs=0.1
    )
    assert spec["engine"]["decode_step_s"] == pytest.approx(
        STEP_S + draft.extra_s(STREAMS), rel=0.01
    )
    assert abs(spec["engine"]["ttft_p50_s"] - base["engine"]["ttft_p50_s"]) <= STEP_S
    # Proxy: TPOT and the per-token step down, several tokens per event, TTFT within a step.
    assert spec["tpot_s"] < base["tpot_s"]
    per_token_step = spec["decode_step_s"] / spec["tokens_per_event"]
    assert per_token_step < 0.5 * base["decode_step_s"]
    assert spec["tokens_per_event"] > 2
    assert abs(spec["ttft_p50_s"] - base["ttft_p50_s"]) <= STEP_S + DELIVERY_S


@pytest.mark.timeout(300)
def test_a_smaller_kv_cache_fits_more_sequences_and_more_tokens_per_second(results):
    kv = rows(results)["kv_budget"]
    full = kv["reference"]
    # Engine: 128K tokens hold 32 caches of 4,096 but all 43 requests at 2,048 each.
    assert full["engine"]["max_decode_batch"] == 32
    assert full["engine"]["max_waiting"] >= STREAMS - 32
    assert kv["engine"]["max_decode_batch"] > STREAMS
    # Tokens out per second while decoding: 40 / decode(40) against 32 / decode(32).
    expected = (STREAMS / COST.decode_s(STREAMS)) / (32 / COST.decode_s(32))
    gain = kv["engine"]["tokens_per_s"] / full["engine"]["tokens_per_s"]
    assert gain == pytest.approx(expected, rel=0.03)
    # Proxy: the same gain (>= 1.1x of the expected 1.22x), and the queueing it avoids.
    assert kv["tokens_per_s"] >= 1.1 * full["tokens_per_s"]
    assert full["ttft_p50_s"] > 2 * kv["ttft_p50_s"]


@pytest.mark.timeout(300)
def test_static_batching_delays_first_tokens_not_decode(results):
    r = rows(results)
    base, static = r["baseline"], r["static_batching"]
    # Engine: the prompts waited for the streams' batch (no prefill while it decoded).
    assert static["engine"]["prefill_in_decode_steps"] == 0
    assert static["engine"]["ttft_p50_s"] > 2 * base["engine"]["ttft_p50_s"]
    assert static["engine"]["decode_step_s"] == pytest.approx(
        base["engine"]["decode_step_s"], rel=0.01
    )
    # Proxy: TTFT up, the decode step within 5%.
    assert static["ttft_p50_s"] > 2 * base["ttft_p50_s"]
    assert abs(static["decode_step_s"] - base["decode_step_s"]) <= DECODE_TOLERANCE * STEP_S


@pytest.mark.timeout(300)
def test_disaggregation_ends_the_stutter_for_a_transfer(results):
    r = rows(results)
    base, disagg = r["baseline"], r["disaggregated"]
    transfer_s = Disaggregated().transfer_s(LONG_PROMPT)
    # Engine: no decode step carries prefill; the longest decodes the streams and the
    # prompts that joined them (decode(41), at most decode(43)); TTFT is the prompt alone
    # on the prefill pool plus the transfer.
    engine = disagg["engine"]
    assert engine["prefill_in_decode_steps"] == 0
    assert STEP_S < engine["worst_step_s"] <= COST.decode_s(STREAMS + 3)
    assert engine["transfer_s"] == pytest.approx(transfer_s)
    assert engine["prefill_s"] == pytest.approx(COST.step_s(0, LONG_PROMPT), abs=TIMER_S)
    # From arrival, the prefill pool's loop may first finish handing the decode pool's
    # last tokens to 40 handlers (one process, one event loop): a few ms.
    model_s = COST.step_s(0, LONG_PROMPT) + transfer_s
    assert model_s - TIMER_S <= engine["ttft_p50_s"] <= model_s + 0.010
    # Proxy: no prefill-induced stall, worst gap within one decode step of the baseline's
    # median gap, TTFT up by the transfer within a step (where a prompt lands in the
    # baseline's running step) plus delivery.
    assert disagg["prefill_stalls"] == 0
    assert disagg["worst_gap_s"] <= base["decode_step_s"] + STEP_S
    ttft_up = disagg["ttft_p50_s"] - base["ttft_p50_s"]
    assert abs(ttft_up - transfer_s) <= STEP_S + DELIVERY_S


@pytest.mark.timeout(300)
def test_a_picture_per_technique(results):
    out = Path(results["out"])
    for name in ORDER:
        png = out / f"technique-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"{name}-long-0" in (out / f"technique-{name}.html").read_text(encoding="utf-8")
