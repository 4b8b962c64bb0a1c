"""Secrets: credentials and prompt text appear in no log line and no metric.

Requests carry ``Authorization``, ``api-key``, ``x-api-key`` and cookie headers
and a prompt with a marker string, along every path (a clean stream, the
upstream's 400 echoing the prompt, an undecodable event quoting it, 413, 502,
504, a client leaving). Logs are captured at DEBUG for the ``tokenstamp`` and
``aiohttp`` loggers (in process) and at ``--log-level debug`` (the real
command); metrics are read in both exposition formats.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import aiohttp
from aiohttp import web

from tests.conftest import Script
from tests.reliability.helpers import CHAT, fetch, sse_error_event
from tests.reliability.streams import stream_events

SECRETS = {
    "Authorization": "Bearer sk-SECRET-MARKER-auth-5f1e",
    "api-key": "SECRET-MARKER-api-key-77aa",
    "x-api-key": "SECRET-MARKER-x-api-key-90b3",
    "Cookie": "session=SECRET-MARKER-cookie-c0c0",
}
PROMPT = "PROMPT-MARKER-4b1d tell me the launch codes"
MARKERS = ("SECRET-MARKER", "PROMPT-MARKER", "launch codes")


def body(**extra: object) -> dict[str, object]:
    return {"model": "m", "stream": True, "seed": 1, "max_tokens": 4,
            "messages": [{"role": "user", "content": PROMPT}], **extra}  # fmt: skip


async def echoing_upstream(request: web.Request) -> web.StreamResponse:
    """Misbehaves the ways real backends do, quoting the prompt back."""
    payload = await request.json()
    mode = request.headers.get("X-Mode", "ok")
    if mode == "400":
        return web.json_response({"error": {"message": f"bad prompt: {PROMPT}",
                                             "type": "BadRequestError"}}, status=400)  # fmt: skip
    if mode == "slow":
        await asyncio.sleep(2)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    events, _ = stream_events(1, 4, usage="stream_options" in payload)
    for ev in events[:-1]:
        await resp.write(ev)
    if mode == "garbage":
        await resp.write(f"data: {{not json {PROMPT}\n\n".encode())
        await resp.write(b"data: " + b"x" * 3000 + PROMPT.encode() + b"\n\n")
    if mode == "error_event":
        await resp.write(sse_error_event("BadRequestError", f"cannot continue {PROMPT}"))
    await resp.write(events[-1])
    return resp


async def _every_path(proxy_url: str, down_url: str) -> None:
    for mode in ("ok", "400", "garbage", "error_event"):
        got = await fetch(proxy_url + CHAT, body(), headers={**SECRETS, "X-Mode": mode})
        assert got.status in (200, 400)
    got = await fetch(proxy_url + CHAT, body(pad="x" * 5000), headers=SECRETS)  # over the limit
    assert got.status == 413
    got = await fetch(proxy_url + CHAT, body(), headers={**SECRETS, "X-Mode": "slow"})
    assert got.status == 504
    got = await fetch(down_url + CHAT, body(), headers=SECRETS)
    assert got.status == 502
    async with aiohttp.ClientSession() as s:  # a client that leaves mid-request
        r = await s.post(proxy_url + CHAT, json=body(), headers={**SECRETS, "X-Mode": "slow"})
        r.close()
    await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as s:  # unobserved route, non-JSON body
        async with s.post(proxy_url + "/v1/embeddings", data=PROMPT.encode(), headers=SECRETS):
            pass


async def _metrics_texts(admin_url: str) -> str:
    out = ""
    async with aiohttp.ClientSession() as s:
        for accept in ("text/plain", "application/openmetrics-text; version=1.0.0"):
            async with s.get(admin_url + "/metrics", headers={"Accept": accept}) as r:
                out += await r.text()
    return out


def _free_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_no_secret_or_prompt_in_logs_or_metrics(aiohttp_server, proxy_factory, caplog,
                                                      figures):  # fmt: skip
    app = web.Application()
    app.router.add_post(CHAT, echoing_upstream)
    app.router.add_post("/v1/embeddings", echoing_upstream)
    server = await aiohttp_server(app)
    up_url = str(server.make_url("")).rstrip("/")
    caplog.set_level(logging.DEBUG)
    for name in ("tokenstamp", "aiohttp", "aiohttp.server", "aiohttp.access", "aiohttp.client"):
        caplog.set_level(logging.DEBUG, logger=name)
    p = await proxy_factory(up_url, max_body_bytes=4000, read_timeout_s=0.5)
    down = await proxy_factory(_free_url())
    await _every_path(p.url, down.url)
    figures.bad_inputs += 9
    exported = await _metrics_texts(p.admin_url) + await _metrics_texts(down.admin_url)
    assert "tokenstamp_requests_total" in exported
    assert caplog.records, "nothing was logged at DEBUG: the capture is not working"
    logged = caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    for marker in MARKERS:
        assert marker not in logged
        assert marker not in exported


async def test_no_secret_or_prompt_in_the_commands_debug_log(aiohttp_server, proxy_process):
    app = web.Application()
    app.router.add_post(CHAT, echoing_upstream)
    app.router.add_post("/v1/embeddings", echoing_upstream)
    server = await aiohttp_server(app)
    p = await proxy_process(str(server.make_url("")).rstrip("/"), "--log-level", "debug",
                            "--max-body-bytes", "4000", "--read-timeout", "0.5")  # fmt: skip
    down = await proxy_process(_free_url(), "--log-level", "debug")
    await _every_path(p.url, down.url)
    exported = await _metrics_texts(p.admin_url)
    await p.child.stop()
    await down.child.stop()
    logged = "\n".join(p.child.log_lines + down.child.log_lines)
    assert "DEBUG" in logged
    for marker in MARKERS:
        assert marker not in logged
        assert marker not in exported


async def test_in_stream_error_type_never_carries_free_text(upstream, proxy_factory):
    free_text = f"{PROMPT} failed"
    upstream.script = Script([(0, sse_error_event(free_text, "x"))])
    p = await proxy_factory(upstream.url)
    await fetch(p.url + CHAT, body())
    exported = await _metrics_texts(p.admin_url)
    assert "PROMPT-MARKER" not in exported
    assert 'error_type="stream_error"' in exported


async def test_malformed_request_is_not_logged_with_its_credentials(upstream, proxy_factory,
                                                                    caplog):  # fmt: skip
    caplog.set_level(logging.DEBUG)
    p = await proxy_factory(upstream.url)
    host, port = p.url.removeprefix("http://").split(":")
    for raw in (
        b"GET /x HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer sk-SECRET-MARKER\x01\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: p\r\nX-Api-Key: SECRET-MARKER" + b"a" * 9000 + b"\r\n\r\n",
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(raw)
        assert (await reader.read(65536)).startswith(b"HTTP/1.0 400")
        writer.close()
    assert "SECRET-MARKER" not in caplog.text
