"""The whole harness, through real subprocesses: ``tokenstamp bench`` on a tiny load."""

from __future__ import annotations

import json
import subprocess
import sys


def test_tiny_run_of_every_target(tmp_path):
    out_json = tmp_path / "bench.json"
    out_md = tmp_path / "bench.md"
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "bench", "--streams", "3", "--duration", "2",
         "--rounds", "1", "--warmup", "0.5", "--max-tokens", "30",
         "--json", str(out_json), "--markdown", str(out_md)],
        capture_output=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(out_json.read_text())
    rows = {r["name"]: r for r in report["targets"]}
    assert list(rows) == ["direct", "passthrough", "tokenstamp"]
    for name, row in rows.items():
        assert row["tokens"] > 0, name
        assert row["errors"] == 0, name
        assert row["transit"]["count"] == row["tokens"]
        assert row["identical"], name
    # The same deterministic answers, byte for byte (send stamps masked), through every target.
    digests = {row["body_sha256"] for row in rows.values()}
    assert len(digests) == 1
    assert len(digests.pop()) == 64
    assert rows["direct"]["cpu_us_per_token"] is None
    assert rows["passthrough"]["cpu_ratio"] == 1.0
    assert rows["tokenstamp"]["cpu_us_per_token"] >= 0
    assert len(report["rounds"]) == 3
    table = out_md.read_text()
    assert table == done.stdout.decode()
    assert "| target | tokens | transit p50 / p99 (ms) |" in table
    assert "| tokenstamp |" in table


def test_bad_flags_exit_2_with_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "bench", "--targets", "direct,nope"],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    err = done.stderr.decode().strip()
    assert err.startswith("tokenstamp bench: error: --targets: unknown target 'nope'")
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
