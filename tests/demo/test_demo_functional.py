"""`tokenstamp demo --json` end to end: the seed's tables, measured through HTTP and the proxy.

Each stutter figure is checked in two stages, each with a tolerance that says
where it comes from:

- model vs engine: the simulator's own record of its steps (ground truth on
  the same clock) against the cost model. A step ends a timer's overshoot late
  (about a millisecond); the step after a late one is shortened by up to
  ``MAX_CATCH_UP_NS``; the engine's process runs late by as long as it waited
  for a CPU.
- engine vs proxy: delivery. The simulator writes a step's 41 tokens and the
  proxy reads and stamps them, a few milliseconds of work on each side; the
  long request also travels through the proxy both ways. Either process can be
  late by as long as it waited for a CPU, which the demo measures.

The new request's first token depends on when in a running step the prompt
arrives: anywhere from the prefill window to the window plus one steady step,
so it is checked against that range, not against the midpoint the table shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from demo.report import render_reasoning
from demo.scenarios import run_queue_wait_ns
from simulator.engine import MAX_CATCH_UP_NS

CATCH_UP_S = MAX_CATCH_UP_NS / 1e9
"""Most a step is shortened because the one before it ended late."""
STEP_SLACK_S = 0.003
"""A step's end: the event loop's timer overshoot and the engine's bookkeeping (~1 ms each)."""
DELIVERY_S = 0.008
"""Writing, reading and stamping one step's tokens (or the request's trip through the proxy)."""

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


def close(measured: float, predicted: float, rel: float = 0.15, abs_s: float = 0.008) -> bool:
    # 15% or a few ms, whichever is larger: holds on a busy 2-core machine.
    return abs(measured - predicted) <= max(rel * predicted, abs_s)


def waited_s(r: dict, *processes: str) -> float:
    """How long these processes waited for a CPU while the long prompt was served."""
    waits = r["measured"]["cpu_wait"]
    return sum(waits[p] or 0.0 for p in processes)


def within(value: float, low: float, high: float) -> bool:
    return low <= value <= high


RUNS = pytest.mark.parametrize("run", ["unchunked", "chunked"])


@pytest.mark.timeout(120)
@RUNS
def test_engine_keeps_to_the_cost_model(results, run):
    r = results[run]
    engine, model = r["engine"], r["model"]
    late = STEP_SLACK_S + waited_s(r, "backend_s")
    assert within(
        engine["worst_gap_s"],
        model["worst_gap_s"] - CATCH_UP_S - STEP_SLACK_S,
        model["worst_gap_s"] + late,
    ), (engine, model, r["measured"]["cpu_wait"])
    # The running step's rest, then the prefill: two step ends.
    assert within(
        engine["ttft_s"], model["ttft_min_s"] - CATCH_UP_S, model["ttft_max_s"] + late + late
    ), (engine, model, r["measured"]["cpu_wait"])


@pytest.mark.timeout(120)
@RUNS
def test_proxy_measures_what_the_engine_did(results, run):
    r = results[run]
    engine, measured = r["engine"], r["measured"]
    delivery = DELIVERY_S + waited_s(r, "proxy_s", "backend_s")
    assert abs(measured["worst_gap_s"] - engine["worst_gap_s"]) <= delivery, (engine, measured)
    # The proxy's TTFT holds the engine's: the request reaches the proxy first.
    assert 0 <= measured["ttft_s"] - engine["ttft_s"] <= delivery, (engine, measured)


@pytest.mark.timeout(120)
@RUNS
def test_stutter_matches_cost_model(results, run):
    """What the table shows next to the model: within 15% (or 8 ms) of it, as the issue
    asks; past that only by as much as the two stages above explain with the CPU waits
    the demo measured (a busy machine), never by more."""
    r = results[run]
    model, measured = r["model"], r["measured"]
    late = STEP_SLACK_S + waited_s(r, "backend_s")
    delivery = DELIVERY_S + waited_s(r, "proxy_s", "backend_s")
    assert close(measured["worst_gap_s"], model["worst_gap_s"]) or within(
        measured["worst_gap_s"],
        model["worst_gap_s"] - CATCH_UP_S - STEP_SLACK_S - delivery,
        model["worst_gap_s"] + late + delivery,
    ), (model, measured)
    ttft_low, ttft_high = model["ttft_min_s"], model["ttft_max_s"]
    assert within(
        measured["ttft_s"],
        min(ttft_low - CATCH_UP_S, ttft_low * 0.85),
        max(ttft_high + 2 * late + delivery, ttft_high * 1.15),
    ), (model, measured)


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


@pytest.mark.timeout(120)
def test_reasoning_model_table(results):
    """The reasoning run's table: the proxy's figures beside the engine's, request by request
    (closer checks of the same run in tests/demo/test_reasoning_functional.py)."""
    r = results["reasoning"]
    table = render_reasoning(r)
    assert "first answer token" in table
    for q in r["requests"]:
        assert q["label"] in table
        p, e = q["proxy"], q["engine"]
        assert (p["answer_ttft_s"] is None) == (e["answer_ttft_s"] is None), q
        assert (p["reasoning_s"] is None) == (e["reasoning_s"] is None), q
        assert p["reasoning_tokens"] == (e["reasoning_tokens"] or None), q
        if p["answer_ttft_s"] is not None:
            assert p["answer_ttft_s"] >= e["answer_ttft_s"], q
    assert Path(r["pictures"]["html"]).name == "timeline-reasoning.html"


def test_run_queue_wait_comes_from_schedstat():
    own = run_queue_wait_ns(os.getpid())
    assert own is None or own >= 0  # None where the kernel keeps no schedstat
    assert run_queue_wait_ns(2**22 + 12345) is None  # above any pid_max: no such process


@pytest.mark.timeout(120)
def test_the_advisor_predicts_both_runs(results):
    """The advisor's rows for 512 and unchunked, fitted on a run of its own, against the runs.

    15% (the module's tolerance for timings on a busy machine): the fit itself is
    validated to 10% in tests/proxy/advisor/; here the demo's runs carry the
    machine's noise too."""
    advice = results["advice"]
    assert advice["status"] == "ok", advice["missing"]
    assert advice["fit"]["chunked"] is True
    assert abs(advice["fit"]["chunk_size"] - 512) <= 0.1 * 512
    rows = {r["chunk_size"]: r for r in advice["table"]}
    for chunk, run in ((512, "chunked"), (None, "unchunked")):
        engine = results[run]["engine"]
        assert close(engine["worst_gap_s"], rows[chunk]["worst_gap_s"]), (run, engine, rows[chunk])
        assert close(results[run]["measured"]["ttft_s"], rows[chunk]["ttft_s"]), run
