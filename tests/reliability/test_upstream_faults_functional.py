"""Faults upstream: resets, stalls, bad framing, malformed streams, error statuses.

Every case runs a real proxy in front of a raw upstream that misbehaves on
purpose (``rawserver``), while a healthy stream runs through the same proxy
at the same time. Each case pins down what the client receives (exact bytes,
or the documented JSON error before any header), what is recorded (outcome,
status class, ``error.type``), that the healthy stream is untouched, and that
the proxy still serves afterwards.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from tests.conftest import Script
from tests.reliability.helpers import (
    CHAT,
    active,
    chat_body,
    decoder_errors,
    expected_healthy,
    fetch,
    healthy,
    outcomes,
    sse_error_event,
)
from tests.reliability.rawserver import LAST_CHUNK, SSE_HEAD, RawConn, chunked
from tests.reliability.streams import chat_chunk

ROLE = b"data: " + json.dumps(chat_chunk("c", "", role=True)).encode() + b"\n\n"
TOKEN = b"data: " + json.dumps(chat_chunk("c", "a")).encode() + b"\n\n"
DONE = b"data: [DONE]\n\n"


def unreachable(kind: str) -> bytes:
    """The exact 502 body for an upstream that failed before its status line."""
    why = {
        "ClientConnectorError": "unreachable",
        "ServerDisconnectedError": "closed the connection without answering",
        "ClientOSError": "reset the connection without answering",
        "ClientResponseError": "answered with something that is not HTTP",
    }[kind]
    msg = f"upstream test-backend {why}: {kind}"
    return json.dumps({"error": {"message": msg, "type": "upstream_unreachable", "code": 502}})\
        .encode()  # fmt: skip


async def _reset_before_headers(conn: RawConn) -> None:
    conn.reset()


async def _close_before_headers(conn: RawConn) -> None:
    return  # FIN right after reading the request


async def _garbage_status_line(conn: RawConn) -> None:
    await conn.send(b"HELLO FROM NOT-HTTP\r\n\r\n")


async def _prefix(conn: RawConn) -> None:
    await conn.send(SSE_HEAD)
    await conn.send(chunked(ROLE))
    await conn.send(chunked(TOKEN))
    await asyncio.sleep(0.1)  # the proxy relays the prefix before the fault


async def _reset_mid_stream(conn: RawConn) -> None:
    await _prefix(conn)
    conn.reset()


async def _bad_chunk_framing(conn: RawConn) -> None:
    await _prefix(conn)
    await conn.send(b"zz-not-hex\r\n")
    await asyncio.sleep(0.2)


async def _stall_mid_stream(conn: RawConn) -> None:
    await _prefix(conn)
    await asyncio.sleep(3)  # far beyond read_timeout_s=0.5


async def _truncated_content_length(conn: RawConn) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    await conn.send(head + b'{"id":"x","choices":[')
    await asyncio.sleep(0.1)


async def _error_event_mid_stream(conn: RawConn) -> None:
    await _prefix(conn)
    await conn.send(chunked(sse_error_event("BadRequestError", "context too long")))
    await conn.send(chunked(DONE) + LAST_CHUNK)


async def _clean_end_inside_an_event(conn: RawConn) -> None:
    await _prefix(conn)
    await conn.send(chunked(b'data: {"choices":[{"delta":{"cont') + LAST_CHUNK)


# name: (behaviour, body sent as stream?, expected status, expected bytes,
#        client-side error, recorded (outcome, status class, error.type))
FAULTS: dict[str, tuple[Callable[[RawConn], Awaitable[None]], bool, int, bytes, str,
                        tuple[str, str, str]]] = {
    "reset_before_headers": (_reset_before_headers, True, 502, unreachable("ClientOSError"), "",
                             ("upstream_error", "5xx", "ClientOSError")),
    "close_before_headers": (_close_before_headers, True, 502,
                             unreachable("ServerDisconnectedError"), "",
                             ("upstream_error", "5xx", "ServerDisconnectedError")),
    "garbage_status_line": (_garbage_status_line, True, 502, unreachable("ClientResponseError"),
                            "", ("upstream_error", "5xx", "ClientResponseError")),
    "reset_mid_stream": (_reset_mid_stream, True, 200, ROLE + TOKEN, "ClientPayloadError",
                         ("upstream_error", "2xx", "ClientPayloadError")),
    # The parser rejects the framing at once: the stream is cut as the upstream's error
    # (aiohttp's client used to drop its read timer here, so it took the watchdog's timeout).
    "bad_chunk_framing_mid_stream": (_bad_chunk_framing, True, 200, ROLE + TOKEN,
                                     "ClientPayloadError",
                                     ("upstream_error", "2xx", "ClientPayloadError")),
    "stall_mid_stream_beyond_read_timeout": (_stall_mid_stream, True, 200, ROLE + TOKEN,
                                             "ClientPayloadError", ("timeout", "2xx", "timeout")),
    "truncated_content_length": (_truncated_content_length, False, 200, b'{"id":"x","choices":[',
                                 "ClientPayloadError",
                                 ("upstream_error", "2xx", "ClientPayloadError")),
    "error_event_mid_stream": (_error_event_mid_stream, True, 200,
                               ROLE + TOKEN + sse_error_event("BadRequestError", "context too long")
                               + DONE, "", ("upstream_error", "2xx", "BadRequestError")),
    "clean_end_inside_an_event": (_clean_end_inside_an_event, True, 200,
                                  ROLE + TOKEN + b'data: {"choices":[{"delta":{"cont', "",
                                  ("ok", "2xx", "")),
}  # fmt: skip


async def _dispatch(conn: RawConn) -> None:
    fault = conn.headers.get("x-fault")
    if fault is None:
        await healthy(conn, pause_s=0.03)
    else:
        await FAULTS[fault][0](conn)


def _strip_healthy(
    recorded: list[tuple[str, str, str, float]],
) -> list[tuple[str, str, str, float]]:
    return [r for r in recorded if r[:3] != ("ok", "2xx", "")]


@pytest.mark.parametrize(
    "name",
    list(FAULTS),
)
async def test_upstream_fault(name, raw_upstream, proxy_factory, figures):
    _, stream, status, body, client_error, recorded = FAULTS[name]
    up = await raw_upstream(_dispatch)
    p = await proxy_factory(up.url, read_timeout_s=0.5)
    with figures.fault():
        async with asyncio.TaskGroup() as tg:
            bystander = tg.create_task(fetch(p.url + CHAT, chat_body()))
            await asyncio.sleep(0.05)
            got = await fetch(p.url + CHAT, chat_body(stream=stream), headers={"X-Fault": name},
                              timeout_s=4)  # fmt: skip
        assert (got.status, got.error) == (status, client_error)
        assert got.body == body
        if status == 502:
            assert got.headers["Content-Type"] == "application/json; charset=utf-8"
            assert got.headers["X-Tokenstamp-Error"] == "upstream_unreachable"
        by = bystander.result()
        assert (by.status, by.body, by.error) == (200, expected_healthy(), "")
        after = await fetch(p.url + CHAT, chat_body())
        assert (after.status, after.body, after.error) == (200, expected_healthy(), "")
        await asyncio.sleep(0.05)
        faulty = [] if recorded == ("ok", "2xx", "") else [(*recorded, 1.0)]
        assert _strip_healthy(outcomes(p)) == faulty
        assert sum(r[3] for r in outcomes(p)) == 3  # each request recorded once
        assert active(p) == 0


async def test_connection_refused_then_upstream_comes_back(proxy_factory, aiohttp_server, figures):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = await proxy_factory(f"http://127.0.0.1:{port}")
    with figures.fault():
        got = await fetch(p.url + CHAT, chat_body())
        assert (got.status, got.body) == (502, unreachable("ClientConnectorError"))

        async def ok(request: web.Request) -> web.Response:
            return web.json_response({"id": "x", "choices": []})

        app = web.Application()
        app.router.add_post(CHAT, ok)
        await aiohttp_server(app, port=port)
        again = await fetch(p.url + CHAT, chat_body(stream=False))
        assert (again.status, again.body) == (200, b'{"id": "x", "choices": []}')
        assert outcomes(p) == [
            ("ok", "2xx", "", 1.0),
            ("upstream_error", "5xx", "ClientConnectorError", 1.0),
        ]


async def test_stream_that_never_ends_is_cut_by_config(upstream, proxy_factory, figures):
    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(ROLE)
        for _ in range(1000):  # bounded by the test itself: 20 s at most
            await resp.write(TOKEN)
            await asyncio.sleep(0.02)
        return resp

    upstream.handler = endless
    with figures.fault():
        p = await proxy_factory(upstream.url, max_stream_duration_s=1.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = await fetch(p.url + CHAT, chat_body(), timeout_s=10)
        assert got.error == "ClientPayloadError"  # cut, not ended cleanly
        assert loop.time() - started < 5
        assert [r[0] for r in outcomes(p)] == ["timeout"]


# Each malformed piece sits between a good role chunk and a good token; the
# stream then ends with [DONE]. (name, piece, decoder errors expected)
_rng = random.Random(20)
MALFORMED: dict[str, tuple[bytes, dict[str, float]]] = {
    "garbage_lines": (b"this is not sse\nneither: is this\n\x00\x01\x02\n\n", {}),
    "binary": (bytes(_rng.getrandbits(8) for _ in range(65536)) + b"\n\n", {}),
    "line_of_10_mb": (b"data: " + b"x" * (10 << 20) + b"\n\n", {"oversized_event": 1}),
    "event_of_200k_short_lines": (b"data: y\n" * 200_000 + b"\n", {"oversized_event": 1}),
    "invalid_utf8_in_data": (b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfe\xc3"}}]}'
                             b"\n\n", {}),
    "invalid_json_in_data": (b'data: {"choices": [{"delta": \n\n', {"invalid_json": 1}),
    "json_not_an_object": (b"data: [1, 2, 3]\n\ndata: \"str\"\n\n", {"invalid_json": 2}),
    "nul_and_controls": (b"data: \x00\x1b[31m\x7f\n\n", {"invalid_json": 1}),
    "100k_blank_lines": (b"\n" * 100_000, {}),
    "100k_comments": (b": keep-alive\n" * 100_000 + b"\n", {}),
    "lone_cr_storm": (b"\r" * 50_000, {}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MALFORMED))
async def test_malformed_stream_passes_through_unchanged(name, upstream, proxy_factory, figures):
    piece, errors = MALFORMED[name]
    stream = ROLE + piece + TOKEN + DONE
    upstream.script = Script([(0, ROLE), (0.01, piece), (0.01, TOKEN), (0, DONE)])
    p = await proxy_factory(upstream.url)
    figures.bad_inputs += 1
    got = await fetch(p.url + CHAT, chat_body(), timeout_s=30)
    assert (got.status, got.error) == (200, "")
    assert got.body == stream
    assert outcomes(p) == [("ok", "2xx", "", 1.0)]
    assert decoder_errors(p) == errors
    after = await fetch(p.url + CHAT, chat_body(stream=False))
    assert after.status == 200


async def test_stream_without_any_newline(upstream, proxy_factory, figures):
    body = b"data: " + b"z" * (3 << 20)  # 3 MiB, no line end, then the stream ends
    upstream.script = Script([(0, body[: 1 << 20]), (0.01, body[1 << 20 :])])
    p = await proxy_factory(upstream.url)
    figures.bad_inputs += 1
    got = await fetch(p.url + CHAT, chat_body(), timeout_s=30)
    assert (got.status, got.body, got.error) == (200, body, "")
    assert outcomes(p) == [("ok", "2xx", "", 1.0)]
    assert decoder_errors(p) == {"oversized_event": 1}


# (status, content type, body, extra headers, recorded outcome, error.type)
HTTP_ERRORS = [
    (500, "text/html", b"<html><body>Internal Server Error</body></html>", {},
     "upstream_error", "500"),
    (503, "application/json", b'{"error":{"message":"overloaded","type":"server_error"}}',
     {"Retry-After": "7"}, "upstream_error", "503"),
    (429, "application/json", b'{"error":{"message":"slow down","type":"rate_limit"}}',
     {"Retry-After": "1", "X-RateLimit-Remaining-Requests": "0"}, "ok", "429"),
    (401, "application/json", b'{"error":{"message":"bad key","type":"invalid_request_error"}}',
     {"WWW-Authenticate": "Bearer"}, "ok", "401"),
    (404, "text/plain", b"no such model", {}, "ok", "404"),
    (500, "text/event-stream", b'data: {"error":{"message":"engine dead","type":"EngineDeadError"}}'
     b"\n\n", {}, "upstream_error", "EngineDeadError"),
]  # fmt: skip


@pytest.mark.parametrize(("status", "ctype", "body", "headers", "outcome", "error_type"),
                         HTTP_ERRORS, ids=[f"{e[0]}-{e[1]}" for e in HTTP_ERRORS])  # fmt: skip
async def test_http_error_passed_through_as_is(status, ctype, body, headers, outcome, error_type,
                                               upstream, proxy_factory, figures):  # fmt: skip
    upstream.script = Script([(0, body)], status=status, content_type=ctype, headers=headers)
    p = await proxy_factory(upstream.url)
    with figures.fault():
        got = await fetch(p.url + CHAT, chat_body())
        assert (got.status, got.body, got.error) == (status, body, "")
        assert got.headers["Content-Type"].startswith(ctype)
        for k, v in headers.items():
            assert got.headers[k] == v
        assert "X-Tokenstamp-Error" not in got.headers  # the upstream's error, not ours
        assert outcomes(p) == [(outcome, f"{status // 100}xx", error_type, 1.0)]
