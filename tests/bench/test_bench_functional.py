"""The whole harness, through real subprocesses: ``tokenstamp bench`` on tiny loads.

Every built-in target that exists on this branch runs for real (nginx when the
binary is installed); figures are checked to exist and be consistent, never
timed against a threshold.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.nginx import find_program

HAVE_NGINX = find_program("nginx") is not None
# tokenstamp-asyncio and tokenstamp-uvloop need ``tokenstamp serve --loop``, which lands
# with the hot path; the targets here are the ones every branch can run.
TARGETS = ["direct", "nginx", "passthrough", "passthrough-uvloop", "tokenstamp",
           "tokenstamp-nostall"]  # fmt: skip
TINY = ["--streams", "4", "--duration", "1.5", "--rounds", "1", "--warmup", "0.4",
        "--max-tokens", "30"]  # fmt: skip


def _bench(tmp_path, *args, timeout=110):
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "bench", *args,
         "--json", str(out_json), "--markdown", str(out_md)],
        capture_output=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    table = out_md.read_text()
    assert table == done.stdout.decode()
    return json.loads(out_json.read_text()), table, done.stderr.decode()


def _expected_names():
    return [n for n in TARGETS if HAVE_NGINX or n != "nginx"]


def test_steady_run_of_every_target_with_memory(tmp_path):
    report, table, _log = _bench(tmp_path, "--targets", ",".join(TARGETS), *TINY,
                                "--memory-streams", "20")  # fmt: skip
    rows = {r["name"]: r for r in report["targets"]}
    assert list(rows) == _expected_names()
    for name, row in rows.items():
        assert row["tokens"] > 0, name
        assert row["errors"] == 0, name
        assert row["transit"]["count"] == row["tokens"]
        assert row["identical"], name  # byte-identical bodies, nginx included
    digests = {row["body_sha256"] for row in rows.values()}
    assert len(digests) == 1
    assert len(digests.pop()) == 64
    assert rows["direct"]["cpu_us_per_token"] is None
    assert rows["direct"]["memory_kib_per_stream"] is None
    assert rows["passthrough"]["cpu_ratio"] == 1.0
    for name in rows.keys() - {"direct"}:
        assert rows[name]["cpu_us_per_token"] > 0, name
        assert rows[name]["memory_kib_per_stream"] > 0, name
    assert {m["target"] for m in report["memory"]} == rows.keys() - {"direct"}
    assert all(m["streams_open"] == 20 for m in report["memory"])
    assert report["options"]["scenario"] == "steady"
    assert "| target | tokens | transit p50 / p99 (ms) |" in table
    assert "KiB per open stream (20)" in table
    assert "| passthrough-uvloop |" in table
    if HAVE_NGINX:
        assert "| nginx |" in table
        assert report["skipped"] == []
    else:
        assert "Skipped nginx: nginx not found" in table
        assert report["skipped"][0]["name"] == "nginx"


def test_lockstep_reports_step_transit_and_last_of_step(tmp_path):
    report, table, _ = _bench(tmp_path, "--scenario", "lockstep", "--targets",
                              "direct,nginx,passthrough,tokenstamp", *TINY, "--step-rate", "20",
                              "--memory-streams", "0")  # fmt: skip
    rows = {r["name"]: r for r in report["targets"]}
    assert report["options"]["scenario"] == "lockstep"
    assert report["options"]["step_rate_per_s"] == 20
    for name, row in rows.items():
        assert row["identical"], name
        assert row["errors"] == 0, name
        # Each step's last-delivered token is one of its tokens: at least its median.
        assert row["last"]["count"] > 0, name
        assert row["last"]["count"] <= row["tokens"]
        assert row["last"]["p50_ms"] >= row["transit"]["p50_ms"], name
        assert row["last"]["max_ms"] == row["transit"]["max_ms"], name
    # 4 streams at 20 steps/s for 1.5 s: each step carries tokens of up to 4 streams.
    assert rows["direct"]["tokens"] <= 4 * rows["direct"]["last"]["count"]
    assert rows["direct"]["extra_last_p99_ms"] is None
    assert rows["passthrough"]["extra_last_p99_ms"] is not None
    assert "last of step p50 / p99 (ms)" in table
    assert report["memory"] == []


def test_tokens_per_write_reaches_every_target_as_whole_chunks(tmp_path):
    """Every read carries 3 chunks: the bodies are still byte-identical through every target."""
    report, table, _ = _bench(tmp_path, "--targets", "direct,passthrough,tokenstamp", *TINY,
                              "--tokens-per-write", "3", "--memory-streams", "0")  # fmt: skip
    assert report["options"]["tokens_per_write"] == 3
    assert "3 tokens per write" in table
    for row in report["targets"]:
        assert row["identical"], row["name"]
        assert row["errors"] == 0, row["name"]
        assert row["tokens"] > 0, row["name"]


def _endless(args):
    return [a for a in args if a not in ("--max-tokens", "30")]


def test_max_rate_without_a_length_streams_endlessly_on_one_core(tmp_path):
    report, table, _ = _bench(tmp_path, "--scenario", "max-rate", "--targets",
                              "direct,nginx,passthrough-uvloop,tokenstamp",
                              *_endless(TINY))  # fmt: skip
    rows = {r["name"]: r for r in report["targets"]}
    assert report["options"]["scenario"] == "max-rate"
    assert report["options"]["max_tokens"] == 0
    for name, row in rows.items():
        assert row["tokens"] > 0, name
        assert row["tokens_per_s"] > 0, name
        assert row["load_cpu_cores"] > 0, name
        assert row["requests_per_s"] is None, name
        assert row["cpu_us_per_request"] is None, name
    for name in rows.keys() - {"direct"}:
        row = rows[name]
        assert 0 < row["target_cpu_cores"] <= 1.05, name  # pinned: at most one core
        per_token_us = row["target_cpu_cores"] / row["tokens_per_s"] * 1e6
        assert row["cpu_us_per_token"] == pytest.approx(per_token_us, rel=0.05), name
    assert "| target | tokens/s | target CPU (cores) |" in table
    assert "closed-loop endless streams" in table
    assert "Bodies not compared in endless max-rate" in table


def test_max_rate_at_a_length_ends_every_request_with_the_backends_body(tmp_path):
    """``--max-tokens 10``: whole requests, one after another, through every target."""
    targets = "direct,nginx,passthrough-uvloop,tcp-relay,tokenstamp"
    report, table, _ = _bench(tmp_path, "--scenario", "max-rate", "--targets", targets,
                              *_endless(TINY), "--max-tokens", "10")  # fmt: skip
    rows = {r["name"]: r for r in report["targets"]}
    assert list(rows) == [n for n in targets.split(",") if HAVE_NGINX or n != "nginx"]
    assert report["options"]["max_tokens"] == 10
    for load in report["rounds"]:
        assert load["errors"] == 0, (load["target"], load["error_samples"])
        assert load["requests_completed"] > 0, load["target"]
        # Tokens count as they arrive, requests as they end (each with its 10 tokens and the
        # backend's body): apart by at most the 4 streams' requests open at the window's edges.
        assert abs(load["tokens"] - 10 * load["requests_completed"]) <= 2 * 4 * 10, load
    digests = {row["body_sha256"] for row in rows.values()}
    assert len(digests) == 1
    assert len(digests.pop()) == 64
    for name, row in rows.items():
        assert row["identical"], name
        assert row["requests_per_s"] > 0, name
    assert rows["direct"]["cpu_us_per_request"] is None
    for name in rows.keys() - {"direct"}:
        row = rows[name]
        per_request_us = row["target_cpu_cores"] / row["requests_per_s"] * 1e6
        assert row["cpu_us_per_request"] == pytest.approx(per_request_us, rel=0.05), name
        per_token_us = row["target_cpu_cores"] / row["tokens_per_s"] * 1e6
        assert row["cpu_us_per_token"] == pytest.approx(per_token_us, rel=0.05), name
    assert "| target | requests/s | tokens/s | target CPU (cores) |" in table
    assert "10 tokens per request and the next request at once" in table
    assert "Every ended body byte-identical to the backend's" in table


def test_two_lengths_give_each_targets_cost_per_request_and_per_token(tmp_path):
    """``--max-tokens 5,40``: each scenario runs at both lengths, then one table fits them;
    with max-rate in the run, the table has its requests/s at 5 tokens."""
    names = [n for n in ("nginx", "passthrough", "tokenstamp") if HAVE_NGINX or n != "nginx"]
    report, table, _ = _bench(tmp_path, "--scenario", "steady,max-rate", "--targets",
                              ",".join(names), *_endless(TINY), "--max-tokens", "5,40",
                              "--memory-streams", "0")  # fmt: skip
    assert table.startswith("Run ")
    lengths = [(s["options"]["scenario"], s["options"]["max_tokens"]) for s in report["scenarios"]]
    assert lengths == [("steady", 5), ("steady", 40), ("max-rate", 5), ("max-rate", 40)]
    at5_rate = {r["name"]: r["requests_per_s"] for r in report["scenarios"][2]["targets"]}
    fitted = table[table.index("steady, fitted from 5, 40 tokens per request") :]
    fitted = fitted[: fitted.index("max-rate:")]
    assert "| max-rate requests/s at 5 tokens |" in fitted
    assert "max-rate, fitted from 5, 40 tokens per request" in table
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in fitted.splitlines()
            if line.startswith("| ") and "target" not in line}  # fmt: skip
    assert set(rows) == set(names)
    for name, cells in rows.items():
        at5, at40, per_request, per_token = (_number(c) for c in cells[1:5])
        if HAVE_NGINX and name != "nginx":  # every cost beside its ratio to nginx's
            for i, cell in enumerate(cells[1:5], start=1):
                mine, ref = _number(cell), _number(rows["nginx"][i])
                if mine <= 0 or ref <= 0:  # a fit below zero on a tiny noisy load: no ratio
                    assert "x)" not in cell, (name, cell)
                    continue
                shown = float(cell.split(" (")[1].rstrip(" |x)"))
                assert shown == pytest.approx(mine / ref, rel=0.02, abs=0.01), (name, cell)
        assert per_request + per_token * 5 == pytest.approx(at5 * 5, rel=0.01)
        assert per_request + per_token * 40 == pytest.approx(at40 * 40, rel=0.01)
        rate = float(cells[5].rstrip(" |").replace(",", ""))
        assert rate == pytest.approx(at5_rate[cells[0].strip("| ")], abs=0.5)


def _number(cell: str) -> float:
    """``1,234 (2.50x)`` -> 1234.0: a table cell's figure without its ratio."""
    return float(cell.strip("| ").split(" (")[0].replace(",", ""))


def test_bad_flags_exit_2_with_one_line():
    for args, start in [
        (["--targets", "direct,nope"], "--targets: unknown target 'nope'"),
        (["--scenario", "steady,bursty"], "--scenario: expected a list of"),
        (["--tokens-per-write", "0"], "--tokens-per-write must be >= 1"),
        (["--max-tokens", "10,0"], "argument --max-tokens: lengths must be distinct"),
        (["--max-tokens", "10,x"], "argument --max-tokens: not a list like 10,200"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "bench", *args],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 2
        err = done.stderr.decode().strip()
        assert err.startswith("tokenstamp bench: error: " + start)
        assert "\n" not in err


def test_a_target_that_cannot_start_fails_cleanly():
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "bench", "--targets", "direct,broken",
         "--define", "broken={python} -c 'raise SystemExit(3)'", "--duration", "1",
         "--rounds", "1"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "broken exited with status 3" in done.stderr.decode()
