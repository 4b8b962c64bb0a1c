"""The request-body budget (``proxy.edge.budget``) through the real proxy, both front doors.

Bodies held at once across all connections are bounded by ``--body-budget``: a
body that does not fit is refused with 503 and ``Retry-After`` before a byte of
it is kept, the connection is closed (its body was not read), and the budget
is given back once a request has gone upstream. The gauges show it.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from proxy.config import ConfigError, config_from_argv
from proxy.edge.budget import BodyBudget, default_budget, memory_limit_bytes
from tests.conformance.rawhttp import Received, parse_responses

CHAT = "/v1/chat/completions"
BUDGET = 64 << 10


def _post(length: int, *, chunked: bool = False) -> bytes:
    if chunked:
        return (f"POST {CHAT} HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n").encode()  # fmt: skip
    return (f"POST {CHAT} HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()  # fmt: skip


def _body(length: int) -> bytes:
    """A JSON chat request of exactly ``length`` bytes."""
    start = b'{"model":"m","messages":[],"pad":"'
    return start + b"x" * (length - len(start) - 2) + b'"}'


async def _open(p) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = p.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def _one_response(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> Received:
    """Read until one whole response has arrived (or the connection closed)."""
    out = b""
    async with asyncio.timeout(timeout_s):
        while chunk := await reader.read(65536):
            out += chunk
            got = parse_responses(out)
            if got.responses and got.responses[0].complete:
                return got
    return parse_responses(out)


def _gauge(p, name: str) -> float:
    value = p.registry.get_sample_value(
        name, {"gen_ai_provider_name": "vllm", "server_address": "test-backend"}
    )
    assert value is not None, name
    return value


@pytest.mark.parametrize("chunked", [False, True], ids=["front-content-length", "aiohttp-chunked"])
async def test_a_body_that_does_not_fit_is_refused_with_503_and_retry_after(
    upstream, proxy_factory, chunked
):
    """Two uploads are held open mid-body; a third that does not fit is refused before it is
    read, and once the first two have gone upstream the budget is whole again."""
    p = await proxy_factory(upstream.url, body_budget_bytes=BUDGET, max_body_bytes=BUDGET // 2)
    assert _gauge(p, "tokenstamp_request_body_budget_bytes") == BUDGET
    size = BUDGET // 2 - 100
    held = []
    for _ in range(2):  # each declares its length, then waits: the budget holds it
        reader, writer = await _open(p)
        body = _body(size)
        writer.write(_post(size) + body[:10])
        held.append((reader, writer, body))
    await asyncio.sleep(0.2)
    assert _gauge(p, "tokenstamp_request_body_held_bytes") == 2 * size

    reader, writer = await _open(p)
    body = _body(size)
    if chunked:  # aiohttp's path: reserved as the chunks arrive
        writer.write(_post(0, chunked=True) + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
    else:
        writer.write(_post(size) + body)
    (refused,) = (await _one_response(reader)).responses
    writer.close()
    assert refused.status == 503
    assert refused.header("retry-after") == [b"1"]
    assert refused.header("x-tokenstamp-error") == [b"body_budget"]
    assert b"--body-budget" in refused.body
    assert json.loads(refused.body)["error"]["code"] == 503
    if not chunked:  # its body was not read: the connection cannot carry another request
        assert refused.header("connection") == [b"close"]
    assert _gauge(p, "tokenstamp_request_body_refused_total") == 1

    for reader, writer, body in held:  # the rest of the held bodies: they go upstream
        writer.write(body[10:])
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200")
        writer.close()
    await asyncio.sleep(0.1)
    assert _gauge(p, "tokenstamp_request_body_held_bytes") == 0
    assert [r["body"] for r in upstream.requests] == [b for _, _, b in held]

    async with aiohttp.ClientSession() as s, s.post(p.url + CHAT, data=_body(size)) as r:
        assert r.status == 200  # the budget is whole again


async def test_a_client_that_leaves_mid_body_gives_its_share_back(upstream, proxy_factory):
    p = await proxy_factory(upstream.url, body_budget_bytes=BUDGET, max_body_bytes=BUDGET)
    _reader, writer = await _open(p)
    writer.write(_post(BUDGET) + b"{")
    await asyncio.sleep(0.1)
    assert _gauge(p, "tokenstamp_request_body_held_bytes") == BUDGET
    writer.close()
    await asyncio.sleep(0.2)
    assert _gauge(p, "tokenstamp_request_body_held_bytes") == 0
    assert upstream.requests == []


def test_the_budget_flag_is_validated_and_defaults_to_a_quarter_of_memory():
    with pytest.raises(ConfigError, match=r"--body-budget: must be 0 .* at least --max-body-bytes"):
        config_from_argv(["--upstream", "http://u", "--max-body-bytes", "1000",
                          "--body-budget", "999"], env={})  # fmt: skip
    cfg = config_from_argv(["--upstream", "http://u", "--max-body-bytes", "1048576",
                           "--body-budget", "1048576"], env={})  # fmt: skip
    assert cfg.body_budget_bytes == 1 << 20
    memory = memory_limit_bytes()
    assert memory is not None
    assert memory > 0
    assert default_budget(1) == memory // 4
    assert default_budget(memory) == memory  # never below one largest body
    with pytest.raises(ValueError, match="> 0"):
        BodyBudget(0)


def test_a_hold_grows_within_the_budget_and_gives_back_once():
    budget = BodyBudget(100)
    a, b = budget.hold(), budget.hold()
    assert a.grow(60)
    assert not b.grow(41)
    assert b.grow(40)
    assert (budget.held, budget.refused) == (100, 1)
    a.release()
    a.release()  # idempotent
    assert budget.held == 40
    b.release()
    assert budget.held == 0
