"""``/advice`` and ``tokenstamp advise`` over real sockets when there is not enough data yet.

The simulator (``fast`` profile) behind the proxy; the command runs as users
run it, in its own process. No traffic, decode traffic without long prompts:
each says which observations are missing, gives no number, and exits 3.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from proxy.advisor import web as advisor_web
from proxy.edge.server import start_proxy
from tests.proxy.advisor.advisorkit import stream
from tests.stallkit import simulator_proxy_config, start_simulator


async def advise(admin_url: str, *flags: str) -> tuple[int, str, str]:
    """``tokenstamp advise --admin URL FLAGS``: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.cli", "advise", "--admin", admin_url, *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.timeout(60)
async def test_no_traffic_is_not_enough_data(aiohttp_server):
    proxy = await start_proxy(simulator_proxy_config(await start_simulator(aiohttp_server, "fast")))
    try:
        rc, out, _ = await advise(proxy.admin_url)
        assert rc == 3
        assert "not enough data: decode gaps with no prefill going on: 0 seen" in out
        rc, out, _ = await advise(proxy.admin_url, "--json", "--prompt-tokens", "4000")
        assert rc == 3
        (backend,) = json.loads(out)["backends"]
        assert backend["status"] == "not enough data"
        assert backend["table"] == []
        assert backend["recommendation"] is None
        assert backend["fit"]["prefill_tokens_per_s"] is None
        assert backend["fit"]["decode_step_s"] == {"base": None, "per_stream": None}
        async with aiohttp.ClientSession() as session:
            async with session.get(proxy.admin_url + "/metrics") as resp:
                samples = [line for line in (await resp.text()).splitlines() if line[:1] != "#"]
        assert [s for s in samples if s.startswith("tokenstamp_backend_")] == []  # no made-up gauge
    finally:
        await proxy.close(drain_timeout_s=1.0)


@pytest.mark.timeout(60)
async def test_decode_without_long_prompts_says_the_prefill_is_missing(aiohttp_server):
    proxy = await start_proxy(simulator_proxy_config(await start_simulator(aiohttp_server, "fast")))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async with asyncio.TaskGroup() as group:  # 8 streams ending one after another
                for i in range(8):
                    group.create_task(stream(session, proxy.url, max_tokens=60 + 30 * i))
        rc, out, _ = await advise(proxy.admin_url, "--json")
        assert rc == 3, out
        (backend,) = json.loads(out)["backends"]
        assert backend["fit"]["decode_step_s"]["base"] is not None
        assert backend["fit"]["prefill_tokens_per_s"] is None
        assert backend["table"] == []
        assert any("no long prompts yet?" in m for m in backend["missing"])
        # The engine: the label, the model the responses named, the upstream's one answer.
        engine = backend["engine"]
        assert engine["provider"] == "vllm"
        assert engine["owned_by"] == "tokenstamp-simulator"
        assert engine["name"] == "tokenstamp-simulator"
        assert engine["server"].startswith("Python/")  # aiohttp's own Server header
        assert engine["response_model"] is not None
        assert engine["probe_error"] is None
        assert backend["fit"]["range"]["streams"] == [
            min(backend["fit"]["observations"]["stream_counts"]),
            max(backend["fit"]["observations"]["stream_counts"]),
        ]
        assert backend["fit"]["range"]["prompt_tokens"] is None  # no prefill fitted
        rc, printed, _ = await advise(proxy.admin_url)
        assert "engine: tokenstamp-simulator (label vllm; server Python/" in printed
        async with aiohttp.ClientSession() as session:
            async with session.get(proxy.admin_url + "/metrics") as resp:
                metrics = await resp.text()
        assert 'tokenstamp_backend_decode_step_base_seconds{gen_ai_provider_name="vllm"' in metrics
        assert "tokenstamp_backend_prefill_rate{" not in metrics
        assert "tokenstamp_backend_prefill_step_seconds{" not in metrics  # absent until fitted
    finally:
        await proxy.close(drain_timeout_s=1.0)


@pytest.mark.timeout(30)
async def test_bad_parameters_and_the_advisor_off(aiohttp_server):
    sim_url = await start_simulator(aiohttp_server, "fast")
    proxy = await start_proxy(simulator_proxy_config(sim_url))
    off = await start_proxy(replace(simulator_proxy_config(sim_url), advisor=False))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(proxy.admin_url + "/advice?streams=many") as resp:
                assert resp.status == 400
                assert "streams: expected an integer >= 0" in await resp.text()
            async with session.get(proxy.admin_url + "/advice?chunk_sizes=512,zero") as resp:
                assert resp.status == 400
            async with session.get(off.admin_url + "/advice") as resp:
                assert resp.status == 404
        rc, _, err = await advise(off.admin_url)
        assert rc == 1
        assert "HTTP 404" in err
        rc, _, err = await advise(proxy.admin_url, "--chunk-sizes", "512,x")
        assert rc == 2
        assert "chunk_sizes" in err
    finally:
        await proxy.close(drain_timeout_s=1.0)
        await off.close(drain_timeout_s=1.0)


@pytest.mark.timeout(60)
async def test_the_fit_and_the_report_leave_the_event_loop_free(aiohttp_server, monkeypatch):
    """A fit of a full evidence buffer costs tens of milliseconds of CPU, more on a busy core;
    on the proxy's loop it would hold every stream's next token (and show in the gaps the proxy
    measures). Each fit and each report, the periodic ones and ``/advice``'s, runs elsewhere:
    wrapped, each one asks the loop to run a callback and waits for it, which only a loop left
    free can do (on the loop's own thread the wrapper records the failure and does not wait)."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    calls: list[tuple[str, bool]] = []
    fitted = asyncio.Event()

    def waits_for_the_loop(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            ran = threading.Event()
            free = threading.get_ident() != loop_thread
            if free:
                loop.call_soon_threadsafe(ran.set)
                free = ran.wait(10.0)
            calls.append((name, free))
            loop.call_soon_threadsafe(fitted.set)
            return real(*args)

        return call

    monkeypatch.setattr(advisor_web, "fit", waits_for_the_loop("fit", advisor_web.fit))
    monkeypatch.setattr(advisor_web, "advise", waits_for_the_loop("advise", advisor_web.advise))
    proxy = await start_proxy(simulator_proxy_config(await start_simulator(aiohttp_server, "fast")))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async with asyncio.TaskGroup() as group:  # decode gaps at 4, 3, 2 and 1 streams
                for i in range(4):
                    group.create_task(stream(session, proxy.url, max_tokens=40 + 20 * i))
            await asyncio.wait_for(fitted.wait(), 10.0)  # the periodic fit, once a second
            async with session.get(proxy.admin_url + "/advice") as resp:
                assert resp.status == 200
                (backend,) = (await resp.json())["backends"]
        assert backend["fit"]["decode_step_s"]["base"] is not None  # the fit ran, and on data
        assert {name for name, _ in calls} == {"fit", "advise"}
        assert all(free for _, free in calls), calls
    finally:
        await proxy.close(drain_timeout_s=1.0)
