"""`tokenstamp demo --json` end to end: the seed's tables, measured through HTTP and the proxy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def close(measured: float, predicted: float, rel: float = 0.15, abs_s: float = 0.008) -> bool:
    # 15% or a few ms, whichever is larger: holds on a busy 2-core machine.
    return abs(measured - predicted) <= max(rel * predicted, abs_s)


_RUNS: list[dict] = []


def _run_demo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pictures = tmp_path_factory.mktemp("demo-pictures")
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "demo", "--json", "--out", str(pictures)],
        capture_output=True, text=True, timeout=110, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


@pytest.fixture
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One demo run shared by this module's tests; a retried test measures again.

    The figures are timings of real processes on a shared machine. When pytest
    retries a failed test (``--reruns``), it gets a fresh run, not the same
    numbers again (a module-scoped fixture would hand back the cached run).
    """
    retry = getattr(request.node, "execution_count", 1) > 1
    if retry or not _RUNS:
        _RUNS[:] = [_run_demo(tmp_path_factory)]
    return _RUNS[0]


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


@pytest.mark.timeout(120)
def test_each_stutter_run_is_drawn_as_png_and_html(results):
    for run in ("unchunked", "chunked"):
        pictures = results[run]["pictures"]
        png, html = Path(pictures["png"]), Path(pictures["html"])
        assert png.name == f"timeline-{run}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        page = html.read_text(encoding="utf-8")
        assert f"{run}-long-prompt" in page
        assert 'id="timeline-data"' in page
