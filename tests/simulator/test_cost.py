"""Cost model, seed predictions and profiles (pure, no sockets)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.cost import (
    CostModel,
    predict_seed_stutter,
    predict_single,
    prompt_tokens_for_ttft,
    seed_cost_model,
)
from simulator.profile import BUILTIN_PROFILES, load_profile, profile_from_mapping

SEED = seed_cost_model()
SEED_512 = seed_cost_model(512)


def test_step_durations():
    cost = CostModel(decode_base_s=0.01, decode_per_seq_s=0.001, prefill_s_per_token=0.0001)
    assert cost.step_s(0, 0) == 0.0
    assert cost.step_s(1, 0) == pytest.approx(0.011)
    assert cost.step_s(10, 0) == pytest.approx(0.020)
    # A prefill-only step still pays the forward pass once.
    assert cost.step_s(0, 100) == pytest.approx(0.01 + 0.01)
    assert cost.step_s(10, 100) == pytest.approx(0.020 + 0.01)
    with pytest.raises(ValueError, match="negative"):
        cost.step_s(-1, 0)


def test_seed_profile_matches_the_seed_text():
    assert SEED.decode_s(1) == pytest.approx(0.022)
    assert SEED.decode_s(40) == pytest.approx(0.025)
    assert SEED.prefill_s_per_token * 4000 == pytest.approx(0.143)
    assert SEED.max_num_seqs == 256
    assert SEED.chunk_size is None
    assert SEED_512.chunk_size == 512


def test_prefill_pieces():
    assert SEED.prefill_pieces(4000) == (4000,)
    assert SEED_512.prefill_pieces(4000) == (512,) * 7 + (416,)
    assert SEED_512.prefill_pieces(1024) == (512, 512)
    assert SEED_512.prefill_pieces(0) == ()


def test_seed_stutter_unchunked():
    p = predict_seed_stutter(SEED)
    # 25 ms of decode and 143 ms of prefill share one step.
    assert p.worst_gap_s == pytest.approx(0.168)
    assert p.steady_gap_s == pytest.approx(0.025)
    assert p.prefill_steps == 1
    assert p.ttft_s == pytest.approx(0.168)
    assert p.token_rate_during_prefill_per_s == pytest.approx(1 / 0.168)


def test_seed_stutter_chunked():
    p = predict_seed_stutter(SEED_512)
    assert p.worst_gap_s == pytest.approx(0.025 + 512 * 0.143 / 4000)
    assert p.worst_gap_s == pytest.approx(0.043, abs=0.001)
    assert p.prefill_steps == 8
    assert p.ttft_s == pytest.approx(0.343, abs=0.001)
    assert p.prefill_window_s == p.ttft_s
    assert p.token_rate_during_prefill_per_s == pytest.approx(23, abs=0.5)


def test_chunking_cuts_the_worst_gap_at_least_three_times():
    unchunked = predict_seed_stutter(SEED).worst_gap_s
    chunked = predict_seed_stutter(SEED_512).worst_gap_s
    assert unchunked / chunked >= 3
    assert predict_seed_stutter(SEED_512).ttft_s / predict_seed_stutter(SEED).ttft_s > 2


def test_predict_single_and_inverse():
    # The seed's example: 480 tokens, 320 ms first token, 22 ms after.
    n = prompt_tokens_for_ttft(SEED, 0.320)
    assert n == pytest.approx(8335, abs=10)
    single = predict_single(SEED, n, 480)
    assert single.ttft_s <= 0.320
    assert predict_single(SEED, n + 1, 480).ttft_s > 0.320
    assert single.tpot_s == pytest.approx(0.022)
    assert single.e2e_s == pytest.approx(10.9, abs=0.05)
    # Chunked: each piece pays the forward pass, so fewer tokens fit the same TTFT.
    n_chunked = prompt_tokens_for_ttft(SEED_512, 0.320)
    assert n_chunked < n
    assert (
        predict_single(SEED_512, n_chunked, 1).ttft_s
        <= 0.320
        < (predict_single(SEED_512, n_chunked + 1, 1).ttft_s)
    )
    # Cached tokens are not prefilled.
    assert predict_single(SEED, 4000, 1, cached_tokens=3984).ttft_s == pytest.approx(
        SEED.step_s(0, 16)
    )
    with pytest.raises(ValueError):
        prompt_tokens_for_ttft(SEED, 0.001)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("decode_base_s", -1.0),
        ("decode_per_seq_s", float("nan")),
        ("prefill_s_per_token", True),
        ("chunk_size", 0),
        ("max_num_seqs", 0),
    ],
)
def test_cost_model_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        replace(SEED, **{field: value})


def test_builtin_profiles_and_json_file(tmp_path: Path):
    assert load_profile("seed").cost == SEED
    assert load_profile("seed-chunked").cost == SEED_512
    assert load_profile("fast").cost.decode_s(40) == pytest.approx(0.0025)
    shipped = Path(__file__).parents[2] / "simulator" / "profiles" / "seed.json"
    assert load_profile(shipped) == BUILTIN_PROFILES["seed"]

    path = tmp_path / "mine.json"
    path.write_text(
        json.dumps(
            {
                "decode_base_s": 0.01,
                "decode_per_seq_s": 0.0001,
                "prefill_s_per_token": 0.00002,
                "chunk_size": 256,
                "output_tokens": 8,
            }
        )
    )
    profile = load_profile(str(path))
    assert profile.name == "mine"
    assert profile.cost.chunk_size == 256
    assert profile.output_tokens == 8
    assert profile.with_overrides(chunk_size=None).cost.chunk_size is None
    assert profile.with_overrides(max_num_seqs=4).cost.max_num_seqs == 4


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"decode_per_seq_s": 0, "prefill_s_per_token": 0}, "decode_base_s"),
        ({"decode_base_s": "x", "decode_per_seq_s": 0, "prefill_s_per_token": 0}, "decode_base_s"),
        (
            {"decode_base_s": 0, "decode_per_seq_s": -1, "prefill_s_per_token": 0},
            "decode_per_seq_s",
        ),
        (
            {"decode_base_s": 0, "decode_per_seq_s": 0, "prefill_s_per_token": 0, "chunk": 5},
            "chunk",
        ),
        (
            {
                "decode_base_s": 0,
                "decode_per_seq_s": 0,
                "prefill_s_per_token": 0,
                "chunk_size": 1.5,
            },
            "chunk_size",
        ),
        (
            {
                "decode_base_s": 0,
                "decode_per_seq_s": 0,
                "prefill_s_per_token": 0,
                "max_num_seqs": 0,
            },
            "max_num_seqs",
        ),
        (
            {
                "decode_base_s": 0,
                "decode_per_seq_s": 0,
                "prefill_s_per_token": 0,
                "output_tokens": 0,
            },
            "output_tokens",
        ),
    ],
)
def test_bad_profile_names_the_key(data, key):
    with pytest.raises(ValueError, match=f"^{key}:"):
        profile_from_mapping(data)


def test_bad_profile_file(tmp_path: Path):
    with pytest.raises(ValueError, match="neither a built-in"):
        load_profile("no-such-profile")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        load_profile(bad)
