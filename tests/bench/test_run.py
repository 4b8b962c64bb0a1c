"""Aggregation over rounds, rotation, and the report built from it."""

from __future__ import annotations

import json
import math

import pytest

from bench.loadgen import LoadResult
from bench.report import markdown, to_json
from bench.run import BenchOptions, BenchReport, RoundResult, aggregate, rotated
from bench.stats import EMPTY, Summary
from bench.targets import select_targets

TARGETS = select_targets("direct,passthrough,tokenstamp")


def _load(tokens: int, p50: float, p99: float, cpu_s: float | None) -> LoadResult:
    cpu = {"backend": 0.1} if cpu_s is None else {"backend": 0.1, "target": cpu_s}
    return LoadResult(
        tokens=tokens, requests_completed=5, errors=0, window_s=1.0,
        transit=Summary(tokens, p50, p50, p99, p99), ttft=EMPTY, gap=EMPTY,
        cpu_s=cpu, loadgen_cpu_s=0.05,
    )  # fmt: skip


def test_rotation_starts_one_later_each_round():
    names = [[t.name for t in rotated(TARGETS, r)] for r in range(4)]
    assert names[0] == ["direct", "passthrough", "tokenstamp"]
    assert names[1] == ["passthrough", "tokenstamp", "direct"]
    assert names[2] == ["tokenstamp", "direct", "passthrough"]
    assert names[3] == names[0]


def test_aggregate_medians_differences_and_ratios():
    opts = BenchOptions(targets=TARGETS, rounds=3)
    results = [
        RoundResult("direct", 0, _load(1000, 0.2, 1.0, None)),
        RoundResult("direct", 1, _load(1000, 0.4, 3.0, None)),
        RoundResult("direct", 2, _load(1000, 0.3, 2.0, None)),
        RoundResult("passthrough", 0, _load(1000, 0.5, 2.5, 0.020)),
        RoundResult("passthrough", 1, _load(1000, 0.6, 9.0, 0.030)),
        RoundResult("passthrough", 2, _load(1000, 0.4, 3.0, 0.025)),
        RoundResult("tokenstamp", 0, _load(1000, 0.5, 3.5, 0.030)),
        RoundResult("tokenstamp", 1, _load(1000, 0.7, 4.0, 0.040)),
        RoundResult("tokenstamp", 2, _load(1000, 0.6, 3.0, 0.035)),
    ]
    digests = {"direct": "aa", "passthrough": "aa", "tokenstamp": "bb"}
    rows = {r.name: r for r in aggregate(opts, results, digests)}
    assert rows["direct"].tokens == 3000
    assert rows["direct"].transit.p50_ms == 0.3
    assert math.isnan(rows["direct"].extra_p50_ms)
    assert math.isnan(rows["direct"].cpu_us_per_token)
    assert rows["passthrough"].cpu_us_per_token == pytest.approx(25.0)
    assert rows["passthrough"].extra_p50_ms == pytest.approx(0.2)
    assert rows["passthrough"].extra_p99_ms == pytest.approx(1.0)
    assert rows["passthrough"].cpu_ratio == pytest.approx(1.0)
    assert rows["tokenstamp"].cpu_us_per_token == pytest.approx(35.0)
    assert rows["tokenstamp"].cpu_ratio == pytest.approx(1.4)
    assert rows["tokenstamp"].backend_us_per_token == pytest.approx(100.0)
    assert rows["passthrough"].identical
    assert not rows["tokenstamp"].identical

    report = BenchReport(opts, tuple(rows.values()), tuple(results), elapsed_s=12.0)
    table = markdown(report)
    assert "| tokenstamp | 3,000 | 0.60 / 3.50 | +0.30 / +1.50 | 35.0 | 1.40x |" in table
    assert "| direct | 3,000 | 0.30 / 2.00 | - | - | - |" in table
    assert "NOT byte-identical to direct's: tokenstamp" in table
    data = to_json(report)
    json.dumps(data, allow_nan=False)  # strict JSON: NaN became null
    assert data["targets"][0]["cpu_us_per_token"] is None
    assert len(data["rounds"]) == 9


def test_loadgen_args_spell_flags():
    from bench.run import loadgen_args

    args = loadgen_args(url="http://x", max_tokens=5, verify=True, cpu_pid=["a=1", "b=2"])
    assert args == ["--url", "http://x", "--max-tokens", "5", "--verify",
                    "--cpu-pid", "a=1", "--cpu-pid", "b=2"]  # fmt: skip
