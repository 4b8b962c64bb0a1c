"""The console script as users run it: help, one-line errors, serve and drain on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import pytest

CLI = [sys.executable, "-m", "proxy.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=30, env=full_env)


def test_help_documents_every_flag_and_its_env():
    out = run_cli("serve", "--help").stdout
    for flag in ("--upstream", "--listen", "--admin", "--backend-name", "--provider",
                 "--max-body-bytes", "--read-timeout", "--model-label-limit", "--inject-usage",
                 "--slo-ttft", "--drain-timeout"):  # fmt: skip
        assert flag in out
    assert "TOKENSTAMP_UPSTREAM" in out


def test_bad_config_exits_2_with_one_line():
    r = run_cli("serve", "--upstream", "not-a-url")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "--upstream" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_option_exits_2():
    r = run_cli("serve", "--upstream", "http://x", "--frobnicate")
    assert r.returncode == 2
    assert "--frobnicate" in r.stderr


def test_port_in_use_names_the_key():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("serve", "--upstream", "http://127.0.0.1:1", "--listen", f"127.0.0.1:{port}",
                    "--admin", f"127.0.0.1:{free_port()}")  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.startswith("tokenstamp: error: --listen: cannot listen")


async def _wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never became ready")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_sigterm_drains_open_streams_then_exits_0(aiohttp_server, loop):
    from aiohttp import web

    async def slow_stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(10):
            await resp.write(b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i)
            await asyncio.sleep(0.1)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow_stream)
    server = await aiohttp_server(app)
    listen, admin = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        *CLI, "serve", "--upstream", str(server.make_url("")), "--listen", f"127.0.0.1:{listen}",
        "--admin", f"127.0.0.1:{admin}", "--drain-timeout", "10", "--loop", loop,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_ready(f"http://127.0.0.1:{admin}/readyz")
        async with aiohttp.ClientSession() as s:
            r = await s.post(f"http://127.0.0.1:{listen}/v1/chat/completions",
                             json={"model": "m", "stream": True, "messages": []})  # fmt: skip
            first = await r.content.readany()
            assert first.startswith(b"data: ")
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            rest = await r.read()  # the open stream completes
            assert rest.endswith(b"data: [DONE]\n\n")
            # New connections are refused once draining started.
            refused = False
            async with aiohttp.ClientSession() as fresh:
                try:
                    async with fresh.get(f"http://127.0.0.1:{listen}/v1/models") as r2:
                        await r2.read()
                except aiohttp.ClientConnectionError:
                    refused = True
            assert refused
        rc = await asyncio.wait_for(proc.wait(), timeout=10)
        assert rc == 0
        assert time.monotonic() - t0 < 5
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
