"""The stutter alert's expression on real data: true for the seed's unchunked run, false chunked.

The seed's scenario (40 streams decoding, one 4,000-token prompt arrives) runs
through the proxy in front of the simulator, once unchunked and once chunked at
512, while a real Prometheus scrapes the proxy every second with the recording
rules generated from a test-sized config (10 s windows, a threshold for a run
of a few seconds). The alert's own expression, taken from the generated alert
rule, must hold after the unchunked run and never hold during the chunked one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from dashboards import alerts, build
from dashboards.config import Config
from demo.cli import _start
from demo.scenarios import run_stutter
from tests.promserver import PrometheusServer

pytestmark = pytest.mark.prometheus

# A run lasts seconds, not the production windows' minutes: 10 s rates, and a
# threshold that the seed's unchunked stall (~0.14 s of 40 streams' ~6 s) clears
# many times over while a run without stalls stays at exactly 0.
TEST_CONFIG = Config(rule_window="10s", stutter_share_threshold=0.002, stall_alert_for="1s")


def _stutter_expr(rules_dir: Path) -> str:
    groups = yaml.safe_load((rules_dir / build.ALERTS_FILE).read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            if rule.get("alert") == alerts.PREFILL_STUTTER:
                return str(rule["expr"])
    raise AssertionError("no stutter alert generated")


async def _run(chunk: int | None, rules_dir: Path) -> list[float]:
    """Run the seed's scenario; the stutter expression's values sampled meanwhile and after."""
    expr = _stutter_expr(rules_dir)
    stack = await _start(chunk)
    seen: list[float] = []
    try:
        target = stack.proxy.admin_url.removeprefix("http://")
        files = [rules_dir / build.RECORDING_FILE]
        async with PrometheusServer({"tokenstamp": [target]}, rule_files=files) as prom:
            await prom.scraped("tokenstamp")

            async def sample() -> None:
                while True:
                    seen.extend(float(r["value"][1]) for r in await prom.query(expr))
                    await asyncio.sleep(0.5)

            sampler = asyncio.get_running_loop().create_task(sample())
            try:
                label = "unchunked" if chunk is None else "chunked"
                await run_stutter(stack.proxy.url, stack.log, label=label)
                # The culprit's cost is counted once its attribution is final (about
                # 2 s), then scraped and recorded: give it a few evaluations.
                await asyncio.sleep(6)
            finally:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
    finally:
        await stack.close()
    return seen


@pytest.mark.timeout(180)
async def test_stutter_alert_fires_unchunked_and_not_chunked(tmp_path):
    build.write(TEST_CONFIG, tmp_path)
    unchunked = await _run(None, tmp_path)
    chunked = await _run(512, tmp_path)
    assert unchunked, "the stutter expression never held during the unchunked run"
    assert max(unchunked) > TEST_CONFIG.stutter_share_threshold
    assert chunked == [], f"the stutter expression held during the chunked run: {chunked}"
