"""End to end: simulator -> proxy -> real Prometheus with our rules -> every dashboard query.

Runs ``tokenstamp simulate`` and ``tokenstamp serve`` as subprocesses, a real
Prometheus scraping the proxy every second with the recording and alerting
rules loaded, sends a bounded burst of streamed chat completions (short
streams, then long prompts whose prefills stall them), and checks that every
dashboard query and every rule evaluates on real data, and that the panels
that matter have data.

A second run puts the proxy in tenant mode (``--tenant-header``) with two
tenants, one of them sending its own SLO targets, and checks the tenant panels
and rules by tenant.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dashboards import build, rules
from dashboards.promql import NO_TENANT
from exporters import names
from tests.promserver import PrometheusServer, free_port


def _importable(*modules: str) -> bool:
    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(
        not _importable("proxy.cli", "simulator.server"), reason="needs proxy and simulator"
    ),
    pytest.mark.prometheus,
]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
SHORT_STREAMS = 12
LONG_PROMPTS = 2
LONG_PROMPT_TOKENS = 4000
MAX_TOKENS = 48
#: Grafana's variables, as a dashboard with "All" selected would send them.
VARIABLES = {
    "$__rate_interval": "1m",
    "$__range": "1m",
    "$backend": ".*",
    "$model": ".*",
    "$tenant": ".*",
}


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


async def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args!r} exited: {_tail(log)}")
            try:
                async with session.get(url) as resp:
                    if resp.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered: {_tail(log)}")


async def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@asynccontextmanager
async def _running(tmp_path: Path, *proxy_args: str) -> AsyncIterator[tuple[str, PrometheusServer]]:
    """Simulator, proxy and Prometheus on free 127.0.0.1 ports; yields (proxy URL, prom)."""
    sim_port, proxy_port, admin_port = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sim_log = tmp_path / "simulate.log"
        procs.append(await _spawn(
            ["simulate", "--listen", f"127.0.0.1:{sim_port}", "--profile", "seed"], sim_log
        ))  # fmt: skip
        await _wait_http(f"http://127.0.0.1:{sim_port}/v1/models", procs[-1], sim_log)
        proxy_log = tmp_path / "serve.log"
        procs.append(await _spawn(
            ["serve", "--upstream", f"http://127.0.0.1:{sim_port}",
             "--listen", f"127.0.0.1:{proxy_port}", "--admin", f"127.0.0.1:{admin_port}",
             "--backend-name", "sim", "--provider", "vllm", *proxy_args], proxy_log,
        ))  # fmt: skip
        await _wait_http(f"http://127.0.0.1:{admin_port}/healthz", procs[-1], proxy_log)
        rule_files = [DASHBOARDS / build.RECORDING_FILE, DASHBOARDS / build.ALERTS_FILE]
        async with PrometheusServer(
            {"tokenstamp": [f"127.0.0.1:{admin_port}"]}, interval="1s", rule_files=rule_files
        ) as prom:
            await prom.scraped("tokenstamp")
            yield f"http://127.0.0.1:{proxy_port}/v1", prom
    finally:
        for proc in reversed(procs):
            _stop(proc)


@pytest.fixture
async def stack(tmp_path) -> AsyncIterator[tuple[str, PrometheusServer]]:
    """The stack of ``_running`` with the proxy's defaults (no tenant labels)."""
    async with _running(tmp_path) as running:
        yield running


async def _load(
    base_url: str, short: Mapping[str, str] | None = None, long: Mapping[str, str] | None = None
) -> None:
    """Short streams decoding, then long prompts whose prefills stall them; bounded.

    ``short`` and ``long``: request headers of the short streams and of the long prompts.
    """
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)

    async def stream(prompt_tokens: int | None, headers: Mapping[str, str] | None) -> None:
        extra = {"sim_prompt_tokens": prompt_tokens} if prompt_tokens else None
        chunks = await client.chat.completions.create(
            model="tokenstamp-sim",
            messages=[{"role": "user", "content": "Tell me about prefill and decode."}],
            max_tokens=MAX_TOKENS,
            stream=True,
            extra_body=extra,
            extra_headers=dict(headers or {}),
        )
        async for _ in chunks:
            pass

    async def long_prompt() -> None:
        await asyncio.sleep(0.3)  # let the short streams reach decode first
        await stream(LONG_PROMPT_TOKENS, long)

    try:
        await asyncio.gather(
            *(stream(None, short) for _ in range(SHORT_STREAMS)),
            *(long_prompt() for _ in range(LONG_PROMPTS)),
        )
    finally:
        await client.close()


def _dashboard_queries(
    variables: Mapping[str, str] = VARIABLES,
) -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL with Grafana's variables filled in)."""
    out = []
    for path in sorted((DASHBOARDS / "grafana").glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
        for annotation in doc["annotations"]["list"]:
            if "expr" in annotation:
                out.append((path.name, annotation["name"], annotation["expr"]))
    filled = []
    for name, title, raw in out:
        expr = raw
        for var, value in variables.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"{name} / {title}: unfilled variable in {expr}"
        filled.append((name, title, expr))
    return filled


#: Panels that must show data after the load (dashboard file, panel title).
MUST_HAVE_DATA = [
    ("tokenstamp-serving-latency.json", "TTFT p50 / p90 / p99"),
    ("tokenstamp-serving-latency.json", "TTFT distribution"),
    ("tokenstamp-serving-latency.json", "TPOT p50 / p90 / p99"),
    ("tokenstamp-serving-latency.json", "Inter-token gap"),
    ("tokenstamp-serving-latency.json", "Worst gap per stream"),
    ("tokenstamp-serving-latency.json", "Request duration p50 / p90 / p99"),
    ("tokenstamp-serving-latency.json", "Decode share of request time"),
    ("tokenstamp-serving-latency.json", "Requests by outcome"),
    ("tokenstamp-serving-latency.json", "Goodput"),
    ("tokenstamp-serving-latency.json", "Output tokens per second"),
    # The proxy runs without --tenant-header: the tenant panels show one line for all.
    ("tokenstamp-serving-latency.json", "Goodput by tenant"),
    ("tokenstamp-serving-latency.json", "TTFT p90 by tenant"),
    ("tokenstamp-prefill-stutter.json", "Stalls per second by cause"),
    ("tokenstamp-prefill-stutter.json", "Streams stalled per prefill"),
    ("tokenstamp-prefill-stutter.json", "TTFT next to prefill stall rate"),
    ("tokenstamp-prefill-stutter.json", "Who stalls whom"),
    # The TTFT half has data whatever the traffic.
    ("tokenstamp-serving-latency.json", "TTFT and time to first answer p50 / p90"),
]

#: Panels whose queries of an instrument are exempt from "has data" while that
#: instrument has no series at all. The simulator has no reasoning profile yet: it
#: streams content only, never reasoning or tool calls, so the reasoning and tool-call
#: instruments stay empty on it. The answer histogram fills with any traffic (every
#: content event is an answer event) once the exporter observes it. The queries must
#: always evaluate; the moment a series of the instrument reaches Prometheus, they
#: must show data like the panels above. Give the simulator a reasoning profile and
#: send reasoning here to end the exemption.
NO_DATA_WITHOUT_REASONING = [
    ("tokenstamp-serving-latency.json", "TTFT and time to first answer p50 / p90",
     names.ANSWER_TTFT),
    ("tokenstamp-serving-latency.json", "Reasoning duration p50 / p90", names.REASONING_DURATION),
    ("tokenstamp-serving-latency.json", "Reasoning share of output tokens",
     names.REASONING_TOKENS),
    ("tokenstamp-serving-latency.json", "Time to first tool call p90", names.TOOL_CALL_TTF),
]  # fmt: skip


def _has_value(samples: list[dict[str, Any]]) -> bool:
    """Some sample is a finite number above zero (a rate of 0 or NaN is no data)."""
    values = [float(x["value"][1]) for x in samples]
    return any(v > 0 and math.isfinite(v) for v in values)


async def _requests_seen(prom: PrometheusServer, count: int) -> None:
    await prom.wait_for(
        'sum(tokenstamp_requests_total{job="tokenstamp"})',
        lambda r: bool(r) and float(r[0]["value"][1]) >= count,
    )


async def _two_waves(
    base_url: str,
    prom: PrometheusServer,
    short: Mapping[str, str] | None = None,
    long: Mapping[str, str] | None = None,
) -> None:
    per_wave = SHORT_STREAMS + LONG_PROMPTS
    # Two waves: the first creates every series (a counter that appears with its
    # first increments already counted has no rate yet), the second moves them.
    await _load(base_url, short, long)
    await _requests_seen(prom, per_wave)
    await asyncio.sleep(1.5)  # at least one more scrape of the unchanged counters
    await _load(base_url, short, long)
    await _requests_seen(prom, 2 * per_wave)


async def test_every_dashboard_query_and_rule_works_on_real_data(stack):
    base_url, prom = stack
    await _two_waves(base_url, prom)
    for template in (rules.STUTTER_SHARE, rules.TTFT_ERRORS, rules.TPOT_ERRORS):
        await prom.wait_for(rules.record_name(template, "5m"), bool, timeout_s=30)

    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    per_query: list[tuple[str, str, str, list[dict[str, Any]]]] = []
    for name, title, expr in _dashboard_queries():
        samples = await prom.query(expr)  # raises on a PromQL error
        results.setdefault((name, title), []).extend(samples)
        per_query.append((name, title, expr, samples))
    empty = [key for key in MUST_HAVE_DATA if not _has_value(results.get(key, []))]
    assert not empty, f"panels without data after the load: {empty}"
    for name, title, inst in NO_DATA_WITHOUT_REASONING:
        reading = [s for n, t, e, s in per_query if (n, t) == (name, title) and inst.prom_name in e]
        assert reading, f"{title}: no query reads {inst.prom_name}"
        if await prom.query(f'{inst.prom_name}_count{{job="tokenstamp"}}'):
            assert all(map(_has_value, reading)), f"{title}: {inst.name} has series, no data"

    groups = (await prom.api("rules"))["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    assert len(loaded) >= 2
    broken = [
        (rule["name"], rule.get("lastError"))
        for group in groups
        for rule in group["rules"]
        if rule.get("health") == "err"
    ]
    assert not broken, broken
    # The proxy is up: the target-down alert is not even pending.
    firing = await prom.query('ALERTS{alertname="TokenstampTargetDown"}')
    assert firing == []


async def _panel(prom: PrometheusServer, title: str, tenant: str = ".*") -> list[dict[str, Any]]:
    """Every sample of the panel ``title``'s queries, ``$tenant`` set to ``tenant``."""
    variables = {**VARIABLES, "$tenant": tenant}
    samples: list[dict[str, Any]] = []
    for _, panel, expr in _dashboard_queries(variables):
        if panel == title:
            samples += await prom.query(expr)
    return samples


def _by(samples: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(x["metric"].get(k, "") for k in labels): float(x["value"][1]) for x in samples}


async def test_tenant_panels_and_rules_on_real_data(tmp_path):
    """Tenant reader streams with its own SLO targets; tenant writer sends the long prompts."""
    reader = {"x-tenant": "reader", "x-slo-ttft-ms": "60000", "x-slo-tpot-ms": "60000"}
    writer = {"x-tenant": "writer"}
    async with _running(tmp_path, "--tenant-header", "x-tenant") as (base_url, prom):
        await _two_waves(base_url, prom, reader, writer)
        await prom.wait_for(rules.record_name(rules.TENANT_GOODPUT_ERRORS, "5m"), bool)
        for _, _title, expr in _dashboard_queries():
            await prom.query(expr)  # raises on a PromQL error

        goodput = _by(await _panel(prom, "Goodput by tenant"), "tokenstamp_tenant")
        assert set(goodput) == {("reader",), ("writer",)}
        # Targets of a minute: every one of reader's streams meets its own.
        assert goodput[("reader",)] == 1
        only = _by(await _panel(prom, "Goodput by tenant", "reader"), "tokenstamp_tenant")
        assert set(only) == {("reader",)}
        sources = _by(await _panel(prom, "Goodput by SLO source"), "tokenstamp_slo_source")
        assert {("request",), ("default",)} <= set(sources)

        whom = _by(
            await _panel(prom, "Who stalls whom"), "tokenstamp_culprit_tenant", "tokenstamp_tenant"
        )
        assert (NO_TENANT, NO_TENANT) not in whom
        assert whom.get(("writer", "reader"), 0) > 0, whom
        cost = _by(await _panel(prom, "Stutter cost by culprit tenant"), "tokenstamp_tenant")
        assert cost.get(("writer",), 0) > 0, cost

        recorded = await prom.query(rules.record_name(rules.TENANT_GOODPUT_ERRORS, "5m"))
        assert {x["metric"]["tokenstamp_tenant"] for x in recorded} == {"reader", "writer"}
