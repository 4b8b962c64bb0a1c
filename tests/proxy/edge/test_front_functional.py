"""The proxy listener's own connections (``proxy.edge.front``), over raw sockets.

Observed requests in the plain HTTP/1.1 form are served by the front; every
other request goes to aiohttp's server at its first byte, and is answered as
before. Each test says which of the two served it (``served``, ``handed_off``)
and checks what the client and the upstream saw, byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
from prometheus_client import generate_latest

from proxy.edge.server import RunningProxy
from tests.conftest import Script

CHAT = "/v1/chat/completions"
BODY = json.dumps({"model": "m", "messages": []}).encode()  # not streamed: no usage asked
EVENTS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"content":"%s"},"finish_reason":null}]}\n\n' % w
    for w in (b"a", b"b", b"c")
] + [b"data: [DONE]\n\n"]


def _post(path: str = CHAT, body: bytes = BODY, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body  # fmt: skip


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One HTTP/1.x response: status line, headers (lower-cased names), de-chunked body.

    An interim ``100 Continue`` is read past."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    while head.split(b" ", 2)[1] == b"100":
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += data[:-2]
    else:
        body = await asyncio.wait_for(reader.read(), 10)
    return lines[0].encode(), headers, body


async def _connect(p: RunningProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = p.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


@pytest.fixture
async def proxy(upstream, proxy_factory) -> RunningProxy:
    upstream.script = Script([(0.0, e) for e in EVENTS])
    return await proxy_factory(upstream.url)


async def test_an_observed_request_is_served_by_the_front_and_keeps_the_connection(proxy, upstream):
    reader, writer = await _connect(proxy)
    try:
        for _ in range(3):
            writer.write(_post())
            status, headers, body = await _response(reader)
            assert status == b"HTTP/1.1 200 OK"
            assert headers["content-type"] == "text/event-stream"
            assert headers["transfer-encoding"] == "chunked"
            assert "connection" not in headers
            assert body == b"".join(EVENTS)
    finally:
        writer.close()
    assert (proxy.front.served, proxy.front.handed_off) == (3, 0)
    assert [r["body"] for r in upstream.requests] == [BODY] * 3
    assert proxy.state.in_flight == 0


async def test_a_body_trickled_byte_by_byte_reaches_the_upstream_whole(proxy, upstream):
    reader, writer = await _connect(proxy)
    try:
        request = _post()
        for i in range(0, len(request), 7):
            writer.write(request[i : i + 7])
            await writer.drain()
            await asyncio.sleep(0.002)
        status, _, body = await _response(reader)
    finally:
        writer.close()
    assert status == b"HTTP/1.1 200 OK"
    assert body == b"".join(EVENTS)
    assert upstream.requests[0]["body"] == BODY
    assert proxy.front.served == 1


async def test_pipelined_requests_are_answered_in_order_whoever_serves_them(proxy, upstream):
    """Two observed requests, then one only forwarded, in one write: the third is
    handed to aiohttp at its first byte and answered by it."""
    reader, writer = await _connect(proxy)
    try:
        other = b"GET /v1/models?x=1 HTTP/1.1\r\nHost: p\r\n\r\n"
        writer.write(_post() + _post() + other)
        answers = [await _response(reader) for _ in range(3)]
    finally:
        writer.close()
    assert [a[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 3
    assert [a[2] for a in answers[:2]] == [b"".join(EVENTS)] * 2
    assert answers[2][2] == b"".join(EVENTS)  # the upstream plays its script on any route
    assert [(r["method"], r["path"]) for r in upstream.requests] == [
        ("POST", CHAT),
        ("POST", CHAT),
        ("GET", "/v1/models?x=1"),
    ]
    assert (proxy.front.served, proxy.front.handed_off) == (2, 1)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(
            b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: "
            b"chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY),
            id="chunked-body",
        ),
        pytest.param(_post(extra="Expect: 100-continue\r\n"), id="expect-continue"),
        pytest.param(_post().replace(b"HTTP/1.1", b"HTTP/1.0", 1), id="http-1.0"),
        pytest.param(_post(path=CHAT + "?a=%41"), id="percent-encoded-target"),
    ],
)
async def test_a_request_in_another_form_is_handed_to_aiohttp_and_answered(
    proxy, upstream, request_bytes
):
    reader, writer = await _connect(proxy)
    try:
        writer.write(request_bytes)
        status, _, body = await _response(reader)
    finally:
        writer.close()
    assert status.endswith(b" 200 OK")
    assert body == b"".join(EVENTS)
    assert upstream.requests[0]["body"] == BODY
    assert (proxy.front.served, proxy.front.handed_off) == (0, 1)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost p\r\n\r\n", id="no-colon"),
        pytest.param(_post().replace(b"\r\n", b"\n"), id="bare-lf-head"),
        pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nX: " + b"x" * 70000, id="huge-head"),
        pytest.param(_post(extra="X: " + "x" * 9000 + "\r\n"), id="long-field"),
        pytest.param(_post(extra="".join(f"X-{i}: y\r\n" for i in range(200))), id="many-fields"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", id="tls-hello"),
        pytest.param(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", id="http2-preface"),
    ],
)
async def test_a_request_that_is_not_http_gets_aiohttps_400(proxy, upstream, request_bytes):
    reader, writer = await _connect(proxy)
    try:
        writer.write(request_bytes)
        status, _, _ = await _response(reader)
    finally:
        writer.close()
    assert b" 400 " in status
    assert upstream.requests == []
    assert proxy.front.handed_off == 1


async def test_connection_close_is_answered_and_honoured(proxy):
    reader, writer = await _connect(proxy)
    try:
        writer.write(_post(extra="Connection: close\r\n"))
        status, headers, body = await _response(reader)
        assert status == b"HTTP/1.1 200 OK"
        assert body == b"".join(EVENTS)
        assert headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the proxy closed it
    finally:
        writer.close()


async def test_an_idle_connection_is_closed_after_the_header_timeout(upstream, proxy_factory):
    upstream.script = Script([(0.0, e) for e in EVENTS])
    p = await proxy_factory(upstream.url, header_timeout_s=0.5)
    reader, writer = await _connect(p)
    try:
        writer.write(_post())
        await _response(reader)
        loop = asyncio.get_running_loop()
        idle_from = loop.time()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert 0.4 < loop.time() - idle_from < 3
    finally:
        writer.close()


async def test_the_header_timeout_counts_from_the_last_response_not_the_first(
    upstream, proxy_factory
):
    """One timer per connection: armed at the first wait, it fires at its old time while
    a later request is served and moves itself on, so the idle time after the last
    response is the whole --header-timeout."""
    upstream.script = Script([(0.0, e) for e in EVENTS])
    p = await proxy_factory(upstream.url, header_timeout_s=0.6)
    reader, writer = await _connect(p)
    loop = asyncio.get_running_loop()
    try:
        for _ in range(3):  # past the first timer's time, kept alive all along
            writer.write(_post())
            status, _, _ = await _response(reader)
            assert status == b"HTTP/1.1 200 OK"
            await asyncio.sleep(0.35)
        writer.write(_post())
        await _response(reader)
        idle_from = loop.time()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert 0.5 < loop.time() - idle_from < 3
    finally:
        writer.close()


async def test_a_declared_body_over_the_limit_is_refused_and_the_connection_closed(
    upstream, proxy_factory
):
    p = await proxy_factory(upstream.url, max_body_bytes=100)
    reader, writer = await _connect(p)
    try:
        writer.write(_post(body=b"{" + b" " * 200 + b"}"))
        status, headers, body = await _response(reader)
        assert status == b"HTTP/1.1 413 Request Entity Too Large"
        assert headers["x-tokenstamp-error"] == "body_too_large"
        assert headers["connection"] == "close"
        assert json.loads(body)["error"]["type"] == "body_too_large"
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()
    assert upstream.requests == []


async def test_a_client_gone_mid_stream_closes_the_upstream(upstream, proxy_factory):
    upstream.script = Script([(0.0, EVENTS[0])] + [(0.05, EVENTS[1])] * 200)
    p = await proxy_factory(upstream.url)
    reader, writer = await _connect(p)
    writer.write(_post())
    await reader.readuntil(b"\r\n\r\n")
    await reader.readuntil(b"\n\n")
    loop = asyncio.get_running_loop()
    gone_at = loop.time()
    writer.transport.abort()
    for _ in range(100):
        if upstream.closed:
            break
        await asyncio.sleep(0.01)
    assert upstream.closed
    assert upstream.closed[0] - gone_at < 0.5
    for _ in range(100):
        if p.state.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert p.state.in_flight == 0
    assert not p.front.connections


async def test_the_front_sets_keepalive_probes_and_no_nagle_like_aiohttp(proxy):
    """SO_KEEPALIVE (a dead peer of a long stream is found) and TCP_NODELAY (a token
    goes out at once) on the client's socket, as aiohttp's server sets them."""
    reader, writer = await _connect(proxy)
    try:
        writer.write(_post())
        await _response(reader)
        (conn,) = proxy.front.connections
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        writer.close()


async def test_a_body_that_is_not_json_is_forwarded_unobserved_by_the_front(
    upstream, proxy_factory
):
    """The front serves it; ``exchange`` forwards it on aiohttp's client, unobserved, and
    the upstream's ``Content-Length`` answer goes back with its length."""
    upstream.script = Script([(0.0, b'{"ok": true}')], content_type="application/json")
    upstream.script.headers = {"Content-Length": "12"}
    p = await proxy_factory(upstream.url)
    reader, writer = await _connect(p)
    try:
        for body in (b"not json", b""):
            writer.write(_post(body=body))
            status, headers, got = await _response(reader)
            assert status == b"HTTP/1.1 200 OK"
            assert headers["content-length"] == "12"
            assert "transfer-encoding" not in headers
            assert got == b'{"ok": true}'
    finally:
        writer.close()
    assert [r["body"] for r in upstream.requests] == [b"not json", b""]
    assert (p.front.served, p.front.handed_off) == (2, 0)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(
            b"GET /ws HTTP/1.1\r\nHost: p\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
            b"200",
            id="websocket-upgrade",
        ),
        pytest.param(
            _post(
                extra="Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
            ),
            b"200",
            id="h2c-upgrade",
        ),
        pytest.param(
            b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
            b"405",
            id="connect",
        ),
        pytest.param(_post().replace(b"Host: p\r\n", b""), b"400", id="no-host"),
        pytest.param(_post(extra="Host: q\r\n"), b"400", id="two-hosts"),
        pytest.param(_post().replace(b"Host: p", b"Host: a b"), b"400", id="host-not-a-host"),
        pytest.param(_post(extra="Content-Type: text/plain\r\n"), b"400", id="two-content-types"),
        pytest.param(
            _post(extra="Sec-WebSocket-Key1: 4 @1  46546xW%0l 1 5\r\n"),
            b"400",
            id="websocket-draft-76",
        ),
        pytest.param(
            b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: gzip, "
            b"chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY),
            b"501",
            id="gzip-transfer-coding",
        ),
    ],
)
async def test_upgrade_connect_and_host_are_answered_never_dropped(
    proxy, upstream, caplog, request_bytes, status
):
    """Handed to aiohttp at their first byte: an Upgrade is forwarded as a plain request
    (the upstream never sees ``Upgrade``, as through nginx), CONNECT is refused (405), a
    missing, repeated or malformed Host is a 400 (RFC 9112 section 3.2), as is any field
    aiohttp refuses, a transfer coding the proxy cannot decode 501; no traceback."""
    reader, writer = await _connect(proxy)
    try:
        writer.write(request_bytes)
        got, headers, _ = await _response(reader)
    finally:
        writer.close()
    assert got.split(b" ")[1] == status
    if status == b"200":
        assert "upgrade" not in {k.lower() for k in upstream.requests[0]["headers"]}
    else:
        assert upstream.requests == []
    if status == b"405":
        assert "CONNECT" not in headers["allow"]
        assert "POST" in headers["allow"]
    assert (proxy.front.served, proxy.front.handed_off) == (0, 1)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_a_flood_of_bad_requests_is_at_most_one_warning_line(proxy, caplog):
    """aiohttp logs each unparsable request with a traceback at ERROR: the proxy's filter
    (one per process, on aiohttp's logger) makes it a WARNING line, then mutes the kind."""
    caplog.set_level(logging.DEBUG)
    (limit,) = [f.limit for f in logging.getLogger("aiohttp.server").filters
                if hasattr(f, "limit")]  # fmt: skip
    before = limit.count
    for _ in range(20):
        reader, writer = await _connect(proxy)
        writer.write(b"GET /x HTTP/1.1\r\nHost: p\r\nBad\x01Name: v\r\n\r\n")
        assert (await reader.read(65536)).startswith(b"HTTP/1.0 400")
        writer.close()
    assert limit.count - before == 20
    lines = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(lines) <= 1  # none when a line of this kind was written moments ago
    for r in lines:
        assert r.levelno == logging.WARNING
        assert r.exc_info is None
        assert "bad request from 127.0.0.1: BadHttpMessage" in r.getMessage()


async def test_interim_responses_reach_an_http11_client_before_the_answer(
    proxy_factory,
):
    """RFC 9110 section 15.2: a proxy forwards the 1xx it did not ask for. The front's
    clients speak HTTP/1.1, so they get each interim head, then the one final response."""
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nConnection: x\r\n\r\n"
    final = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%b"
    body = b"".join(EVENTS)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(hints)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(final % (len(body), body))
        await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        p = await proxy_factory(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        reader, writer = await _connect(p)
        writer.write(_post())
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        status, headers, got = await _response(reader)
        writer.close()
    finally:
        server.close()
    assert interim == b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
    assert status == b"HTTP/1.1 200 OK"
    assert got == body
    assert "link" not in headers


@pytest.mark.parametrize("trust", [True, False])
async def test_forwarding_headers_are_passed_or_replaced_as_configured(
    upstream, proxy_factory, trust
):
    upstream.script = Script([(0.0, e) for e in EVENTS])
    p = await proxy_factory(upstream.url, trust_forwarded=trust)
    claimed = ("X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n"
               "X-Forwarded-Host: api.example\r\nForwarded: for=203.0.113.9\r\n"
               "X-Real-IP: 203.0.113.9\r\n")  # fmt: skip
    for request in (_post(extra=claimed), _post(path="/v1/embeddings", extra=claimed)):
        reader, writer = await _connect(p)
        writer.write(request)
        await _response(reader)
        writer.close()
    for seen in upstream.requests:  # the front's path, then aiohttp's: the same rule
        h = {k.lower(): v for k, v in seen["headers"].items()}
        if trust:
            assert h["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
            assert h["x-forwarded-proto"] == "https"
            assert (h["x-forwarded-host"], h["forwarded"], h["x-real-ip"]) == (
                "api.example", "for=203.0.113.9", "203.0.113.9")  # fmt: skip
        else:
            assert (h["x-forwarded-for"], h["x-forwarded-proto"]) == ("127.0.0.1", "http")
            assert not {"x-forwarded-host", "forwarded", "x-real-ip"} & h.keys()


async def test_head_is_answered_with_the_upstreams_head_and_no_body(proxy, upstream):
    reader, writer = await _connect(proxy)
    try:
        writer.write(b"HEAD /v1/models HTTP/1.1\r\nHost: p\r\n\r\n" + _post())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        status, _, body = await _response(reader)  # the next answer follows at once
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert status == b"HTTP/1.1 200 OK"
    assert body == b"".join(EVENTS)
    assert [r["method"] for r in upstream.requests] == ["HEAD", "POST"]


async def test_a_compressed_request_body_goes_upstream_as_the_client_sent_it(proxy_factory):
    """Whichever door reads it: the front (Content-Length) or aiohttp's server (chunked),
    which would otherwise decompress it and forward other bytes under the same
    Content-Encoding. The upstream is raw: it keeps the bytes as they came."""
    import gzip

    packed = gzip.compress(BODY)
    bodies: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            bodies.append(await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        p = await proxy_factory(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        requests = [
            _post(body=packed, extra="Content-Encoding: gzip\r\n"),
            b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: p\r\nContent-Encoding: gzip\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(packed), packed),
        ]
        for request in requests:
            reader, writer = await _connect(p)
            writer.write(request)
            assert (await _response(reader))[2] == b"ok"
            writer.close()
    finally:
        server.close()
    assert bodies == [packed, packed]
    assert (p.front.served, p.front.handed_off) == (1, 1)


STREAMED = json.dumps({"model": "m", "messages": [], "stream": True}).encode()


@pytest.mark.parametrize("observe", [True, False])
async def test_observation_off_forwards_untouched_through_the_same_front(
    observe, upstream, proxy_factory
):
    """``--observe false``: the front serves the observed route as ever, the upstream gets
    the client's body and headers as sent (no usage asked for, no ``identity`` forced),
    the answer comes back byte for byte, and nothing is recorded but ``observation_off``.
    With observation on (the control) the same request is timed and its body rewritten."""
    upstream.script = Script([(0.0, e) for e in EVENTS])
    p = await proxy_factory(upstream.url, observe=observe)
    reader, writer = await _connect(p)
    try:
        for _ in range(2):
            writer.write(_post(body=STREAMED, extra="Accept-Encoding: gzip\r\n"))
            status, _, body = await _response(reader)
            assert status == b"HTTP/1.1 200 OK"
            assert body == b"".join(EVENTS)
    finally:
        writer.close()
    assert (p.front.served, p.front.handed_off) == (2, 0)
    sent = upstream.requests[0]
    unobserved = p.registry.get_sample_value(
        "tokenstamp_requests_unobserved_total",
        {"gen_ai_provider_name": "vllm", "server_address": "test-backend",
         "tokenstamp_reason": "observation_off"},
    )  # fmt: skip
    ttft = p.registry.get_sample_value(
        "gen_ai_server_time_to_first_token_seconds_count",
        {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "vllm",
         "gen_ai_request_model": "m", "server_address": "test-backend"},
    )  # fmt: skip
    if observe:
        assert sent["body"] != STREAMED  # usage asked for on the client's behalf
        assert sent["headers"]["Accept-Encoding"] == "identity"
        assert (unobserved, ttft) == (None, 2)
    else:
        assert [r["body"] for r in upstream.requests] == [STREAMED] * 2
        assert sent["headers"]["Accept-Encoding"] == "gzip"
        assert (unobserved, ttft) == (2, None)
        text = generate_latest(p.registry).decode()
        assert "tokenstamp_requests_total{" not in text
    assert p.state.in_flight == 0
