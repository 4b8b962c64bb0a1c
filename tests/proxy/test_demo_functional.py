"""`tokenstamp demo --json` end to end: the seed's tables, measured through HTTP and the proxy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def close(measured: float, predicted: float, rel: float = 0.15, abs_s: float = 0.008) -> bool:
    # 15% or a few ms, whichever is larger: holds on a busy 2-core machine.
    return abs(measured - predicted) <= max(rel * predicted, abs_s)


@pytest.fixture(scope="module")
def results() -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "demo", "--json"],
        capture_output=True, text=True, timeout=110, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("run", ["unchunked", "chunked"])
@pytest.mark.parametrize("key", ["worst_gap_s", "ttft_s"])
def test_stutter_matches_cost_model(results, run, key):
    r = results[run]
    assert close(r["measured"][key], r["model"][key]), (run, key, r)


@pytest.mark.timeout(120)
def test_token_rate_during_prefill(results):
    for run in ("unchunked", "chunked"):
        r = results[run]
        # A rate over a window of a few steps: one token more or less is the tolerance.
        window = r["measured"]["window_s"]
        assert (
            abs(r["measured"]["token_rate_per_s"] - r["model"]["token_rate_per_s"]) <= 1.5 / window
        )


@pytest.mark.timeout(120)
def test_chunking_cuts_the_stall_at_least_3x(results):
    u = results["unchunked"]["measured"]["worst_gap_s"]
    c = results["chunked"]["measured"]["worst_gap_s"]
    assert u >= 3 * c


@pytest.mark.timeout(120)
def test_single_request_table(results):
    s = results["single"]
    assert s["measured"]["output_tokens"] == 480
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert close(s["measured"][key], s["model"][key]), (key, s)
