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


def _lockstep_load(tokens, p50, p99, last_p50, last_p99, cpu_s):
    base = _load(tokens, p50, p99, cpu_s)
    from dataclasses import replace

    return replace(base, last=Summary(tokens // 4, last_p50, last_p50, last_p99, last_p99))


def test_lockstep_rows_carry_the_last_of_each_step_and_its_extra():
    opts = BenchOptions(targets=TARGETS, rounds=1, scenario="lockstep", streams=256)
    results = [
        RoundResult("direct", 0, _lockstep_load(1000, 1.0, 3.0, 2.0, 4.0, None)),
        RoundResult("passthrough", 0, _lockstep_load(1000, 2.0, 6.0, 4.0, 9.0, 0.05)),
        RoundResult("tokenstamp", 0, _lockstep_load(1000, 2.5, 7.0, 5.0, 12.0, 0.06)),
    ]
    rows = {
        r.name: r
        for r in aggregate(
            opts, results, dict.fromkeys(("direct", "passthrough", "tokenstamp"), "aa")
        )
    }
    assert rows["tokenstamp"].last.p99_ms == 12.0
    assert rows["tokenstamp"].extra_last_p50_ms == pytest.approx(3.0)
    assert rows["tokenstamp"].extra_last_p99_ms == pytest.approx(8.0)
    assert math.isnan(rows["direct"].extra_last_p99_ms)
    report = BenchReport(opts, tuple(rows.values()), tuple(results), elapsed_s=3.0)
    table = markdown(report)
    assert table.startswith("lockstep: 256 streams, 25 steps/s")
    assert "| last of step p50 / p99 (ms) | extra last vs direct p50 / p99 (ms) |" in table
    assert (
        "| tokenstamp | 1,000 | 2.50 / 7.00 | +1.50 / +4.00 | 5.00 / 12.00 | +3.00 / +8.00 | 60.0 | 1.20x |"
        in table
    )


def test_max_rate_rows_are_tokens_per_second_and_cores_with_the_bound():
    from dataclasses import replace

    from bench.report import bound

    opts = BenchOptions(targets=TARGETS, rounds=2, scenario="max-rate", streams=128,
                        max_tokens=0)  # fmt: skip

    def mr(tokens, window, target_cpu, load_cpu):
        return replace(
            _load(tokens, math.nan, math.nan, target_cpu),
            window_s=window,
            loadgen_cpu_s=load_cpu,
            transit=EMPTY,
        )

    results = [
        RoundResult("direct", 0, mr(40_000, 1.0, None, 0.99)),
        RoundResult("direct", 1, mr(42_000, 1.0, None, 0.98)),
        RoundResult("passthrough", 0, mr(10_000, 1.0, 0.98, 0.40)),
        RoundResult("passthrough", 1, mr(12_000, 1.0, 0.97, 0.45)),
        RoundResult("tokenstamp", 0, mr(8_000, 2.0, 1.5, 0.5)),
        RoundResult("tokenstamp", 1, mr(9_000, 2.0, 1.4, 0.5)),
    ]
    digests = dict.fromkeys(("direct", "passthrough", "tokenstamp"), "-")
    rows = {r.name: r for r in aggregate(opts, results, digests)}
    assert rows["direct"].tokens_per_s == 41_000
    assert rows["passthrough"].tokens_per_s == 11_000
    assert rows["passthrough"].target_cpu_cores == pytest.approx(0.975)
    assert rows["tokenstamp"].tokens_per_s == 4_250
    assert rows["tokenstamp"].target_cpu_cores == pytest.approx(0.725)
    assert bound(rows["direct"]) == "load"
    assert bound(rows["passthrough"]) == "target"
    assert bound(rows["tokenstamp"]) == "neither"
    assert all(r.identical for r in rows.values())
    table = markdown(BenchReport(opts, tuple(rows.values()), tuple(results), elapsed_s=9.0))
    assert "| passthrough | 11,000 | 0.97 | 0.43 | 89.4 | 1.00x | target |" in table
    assert "| direct | 41,000 | - | 0.98 | - | - | load |" in table
    assert "Bodies not compared in endless max-rate" in table
    assert "requests/s" not in table
    assert math.isnan(rows["passthrough"].requests_per_s)


def test_max_rate_at_a_length_adds_requests_per_second_and_cpu_per_request():
    from dataclasses import replace

    opts = BenchOptions(targets=TARGETS, rounds=2, scenario="max-rate", streams=128,
                        max_tokens=10)  # fmt: skip

    def mr(requests, target_cpu, digest="ab"):
        load = _load(requests * 10, math.nan, math.nan, target_cpu)
        return replace(load, window_s=2.0, loadgen_cpu_s=0.8, transit=EMPTY,
                       requests_completed=requests, body_sha256=digest)  # fmt: skip

    results = [
        RoundResult("direct", 0, mr(4_000, None)),
        RoundResult("direct", 1, mr(4_200, None)),
        RoundResult("passthrough", 0, mr(2_000, 1.9)),
        RoundResult("passthrough", 1, mr(2_200, 1.9)),
        RoundResult("tokenstamp", 0, mr(1_000, 1.9)),
        RoundResult("tokenstamp", 1, mr(1_000, 1.9, digest="cd")),
    ]
    from bench.run import _max_rate_digests

    digests = _max_rate_digests(opts, results)
    assert digests == {"direct": "ab", "passthrough": "ab", "tokenstamp": "rounds differ"}
    rows = {r.name: r for r in aggregate(opts, results, digests)}
    assert rows["passthrough"].requests_per_s == 1_050
    assert rows["passthrough"].tokens_per_s == 10_500
    # 1.9 s of CPU over 2,000 and 2,200 requests: 950 and ~864 µs, median ~907.
    assert rows["passthrough"].cpu_us_per_request == pytest.approx((950 + 1.9e6 / 2200) / 2)
    assert rows["tokenstamp"].cpu_us_per_request == pytest.approx(1_900)
    assert math.isnan(rows["direct"].cpu_us_per_request)
    assert rows["passthrough"].identical
    assert not rows["tokenstamp"].identical
    table = markdown(BenchReport(opts, tuple(rows.values()), tuple(results), elapsed_s=9.0))
    assert (
        "| target | requests/s | tokens/s | target CPU (cores) | load CPU (cores) | "
        "CPU µs/request | CPU µs/token |" in table
    )
    assert "| passthrough | 1,050 | 10,500 | 0.95 | 0.40 | 907 | 90.7 | 1.00x | target |" in table
    assert "10 tokens per request and the next request at once" in table
    assert "Bodies NOT byte-identical to direct's: tokenstamp." in table


def test_memory_column_and_skipped_targets_are_reported():
    from bench.memload import MemoryResult

    opts = BenchOptions(targets=TARGETS, rounds=1, memory_streams=1000)
    results = [RoundResult(n, 0, _load(100, 0.3, 1.0, None if n == "direct" else 0.01))
               for n in ("direct", "passthrough", "tokenstamp")]  # fmt: skip
    memory = {"passthrough": MemoryResult(1000, {"target": 30_000}, {"target": 57_700}, 1.2),
              "tokenstamp": MemoryResult(990, {"target": 40_000}, {"target": 59_800}, 1.3)}  # fmt: skip
    rows = aggregate(
        opts, results, dict.fromkeys(("direct", "passthrough", "tokenstamp"), "a"), memory
    )
    by = {r.name: r for r in rows}
    assert by["passthrough"].memory_kib_per_stream == pytest.approx(27.7)
    assert by["tokenstamp"].memory_kib_per_stream == pytest.approx(20.0)
    assert math.isnan(by["direct"].memory_kib_per_stream)
    report = BenchReport(opts, rows, tuple(results), elapsed_s=1.0,
                         skipped=(("nginx", "nginx not found on PATH or in /usr/sbin"),),
                         memory=tuple(memory.items()))  # fmt: skip
    table = markdown(report)
    assert "| KiB per open stream (1,000) |" in table
    assert "| passthrough | 100 | 0.30 / 1.00 | +0.00 / +0.00 | 100.0 | 1.00x | 27.7 |" in table
    assert "Skipped nginx: nginx not found on PATH or in /usr/sbin." in table
    assert "Memory of tokenstamp: only 990 streams opened." in table
    data = to_json(report)
    json.dumps(data, allow_nan=False)
    assert data["skipped"] == [
        {"name": "nginx", "reason": "nginx not found on PATH or in /usr/sbin"}
    ]
    assert data["memory"][0]["target"] == "passthrough"


def test_a_missing_program_skips_its_target_and_the_run_goes_on():
    from bench.run import run_bench
    from bench.targets import TargetSpec

    ghost = TargetSpec(
        "ghost", ("no-such-program-tokenstamp",), requires="no-such-program-tokenstamp"
    )
    opts = BenchOptions(targets=(TARGETS[0], ghost), streams=2, duration_s=0.5, rounds=1,
                        max_tokens=10, warmup_s=0.2)  # fmt: skip
    report = run_bench(opts, log=lambda line: None)
    assert [r.name for r in report.rows] == ["direct"]
    assert report.rows[0].tokens > 0
    assert report.skipped == (
        ("ghost", "no-such-program-tokenstamp not found on PATH or in /usr/sbin"),
    )
    assert "Skipped ghost:" in markdown(report)
