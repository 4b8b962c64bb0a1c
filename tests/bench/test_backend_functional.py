"""The stamping backend, the bare pass-through and the load generator, in process over sockets."""

from __future__ import annotations

import asyncio
import json
import time

import openai

from bench.backend import STAMP_FIELD, BackendConfig, ChunkFormat, create_app
from bench.loadgen import LoadPlan, mask_stamps, run_load
from bench.passthrough import create_app as create_passthrough
from proxy.core.decoders.openai import interpret
from proxy.core.decoders.sse import SseDecoder

CONFIG = BackendConfig(rate_per_s=200.0, default_max_tokens=5, created_unix_s=1_718_000_000)


async def _backend_url(aiohttp_server) -> str:
    server = await aiohttp_server(create_app(CONFIG))
    return str(server.make_url("")).rstrip("/")


async def _stream(aiohttp_client, app, body: dict) -> bytes:
    client = await aiohttp_client(app)
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    return await resp.read()


async def test_stream_is_vllm_shaped_and_stamped(aiohttp_client):
    before_ns = time.monotonic_ns()
    raw = await _stream(aiohttp_client, create_app(CONFIG), {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": 4, "stream_options": {"include_usage": True},
    })  # fmt: skip
    after_ns = time.monotonic_ns()
    events = SseDecoder(1 << 20).feed(raw)
    infos = [interpret(e.data) for e in events]
    assert [i.output for i in infos if i] == [False, True, True, True, True, False, False, False]
    assert infos[-1].done
    assert infos[-2].usage_only
    assert infos[-2].usage.completion_tokens == 4
    assert infos[-3].finish_reasons == ("length",)
    stamps = [int(json.loads(e.data)["bench_send_ns"]) for e in events[1:5]]
    assert before_ns < stamps[0] < stamps[1] < stamps[2] < stamps[3] < after_ns
    # Deadlines are absolute from the request's start: token i leaves no earlier than
    # (i + 1) periods of 5 ms after it (a late token is not followed by late ones).
    assert stamps[3] - before_ns >= 4 * 5_000_000
    objs = [json.loads(e.data) for e in events[:-1]]
    assert {o["id"] for o in objs} == {objs[0]["id"]}
    assert all(o["created"] == 1_718_000_000 and o["model"] == "m" for o in objs)
    assert all(150 <= len(raw_event) <= 300 for raw_event in raw.split(b"\n\n")[1:5])


async def test_same_prompt_same_bytes_and_other_keys_ignored(aiohttp_client):
    body = {"messages": [{"role": "user", "content": "same"}], "stream": True, "max_tokens": 6}
    a = await _stream(aiohttp_client, create_app(CONFIG), body)
    b = await _stream(aiohttp_client, create_app(CONFIG),
                      {**body, "stream_options": {"include_usage": False}})  # fmt: skip
    c = await _stream(aiohttp_client, create_app(CONFIG),
                      {**body, "messages": [{"role": "user", "content": "other"}]})  # fmt: skip
    assert a != b  # the stamps differ ...
    assert mask_stamps(a) == mask_stamps(b)  # ... and nothing else
    assert mask_stamps(a) != mask_stamps(c)
    assert mask_stamps(a).count(STAMP_FIELD + b"0" * 20) == 6


async def test_openai_sdk_reads_the_backend(aiohttp_server):
    url = await _backend_url(aiohttp_server)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="bench-model", messages=[{"role": "user", "content": "q"}], stream=True,
            max_tokens=7,
        )  # fmt: skip
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        whole = await client.chat.completions.create(
            model="bench-model", messages=[{"role": "user", "content": "q"}], max_tokens=7
        )
    finally:
        await client.close()
    from bench.backend import Answer

    expected = ChunkFormat(Answer(True, False, 7, "bench-model", "q"), 0).text(7)
    assert text == expected
    assert whole.choices[0].message.content == expected
    assert whole.usage.completion_tokens == 7


async def test_bad_max_tokens_is_400(aiohttp_client):
    client = await aiohttp_client(create_app(CONFIG))
    resp = await client.post("/v1/chat/completions", json={"stream": True, "max_tokens": 0})
    assert resp.status == 400
    assert "max_tokens" in (await resp.json())["error"]["message"]
    resp = await client.post("/v1/chat/completions", data=b"not json")
    assert resp.status == 400


async def test_passthrough_relays_byte_identical_streams(aiohttp_server):
    url = await _backend_url(aiohttp_server)
    proxy = await aiohttp_server(create_passthrough(url))
    proxy_url = str(proxy.make_url("")).rstrip("/")
    plan = LoadPlan(url=url, streams=3, max_tokens=5, requests=2, usage="alternate", verify=True)
    direct = await run_load(plan)
    relayed = await run_load(LoadPlan(**{**_fields(plan), "url": proxy_url}))
    assert direct.errors == relayed.errors == 0
    assert direct.requests_completed == relayed.requests_completed == 6
    assert direct.tokens == relayed.tokens == 30
    assert direct.transit.count == 30
    assert direct.gap.count == 24
    assert direct.ttft.count == 6
    assert direct.body_sha256
    assert direct.body_sha256 == relayed.body_sha256


async def test_tcp_relay_relays_byte_identical_streams(aiohttp_server, unused_tcp_port):
    """The floor target: raw bytes both ways, every response identical to the direct one."""
    from bench.tcprelay import serve

    url = await _backend_url(aiohttp_server)
    relay = asyncio.get_running_loop().create_task(serve(url, f"127.0.0.1:{unused_tcp_port}"))
    try:
        await asyncio.sleep(0.2)
        plan = LoadPlan(url=url, streams=3, max_tokens=5, requests=2, usage="alternate",
                        verify=True)  # fmt: skip
        direct = await run_load(plan)
        relayed = await run_load(
            LoadPlan(**{**_fields(plan), "url": f"http://127.0.0.1:{unused_tcp_port}"})
        )
    finally:
        relay.cancel()
    assert direct.errors == relayed.errors == 0
    assert relayed.requests_completed == 6
    assert relayed.tokens == 30
    assert direct.body_sha256 == relayed.body_sha256


async def test_window_mode_counts_only_the_window_and_stops(aiohttp_server):
    url = await _backend_url(aiohttp_server)
    plan = LoadPlan(url=url, streams=4, max_tokens=50, duration_s=0.5, warmup_s=0.2,
                    cpu_pids=(("self", __import__("os").getpid()),))  # fmt: skip
    started = time.monotonic()
    res = await run_load(plan)
    assert time.monotonic() - started < 5
    assert res.errors == 0
    assert res.tokens > 0
    assert res.tokens == res.transit.count
    assert 0.4 < res.window_s < 1.5
    assert res.cpu_s["self"] >= 0
    assert res.body_sha256 == ""


def _fields(plan: LoadPlan) -> dict:
    return {f: getattr(plan, f) for f in plan.__dataclass_fields__}


async def test_lockstep_writes_every_open_stream_in_the_same_step(aiohttp_server):
    from bench.backend import BackendConfig as Config

    server = await aiohttp_server(create_app(Config(rate_per_s=1.0, step_rate_per_s=50.0,
                                                    created_unix_s=1)))  # fmt: skip
    url = str(server.make_url("")).rstrip("/")
    plan = LoadPlan(url=url, streams=3, max_tokens=6, requests=1, verify=True, steps=True)
    started = time.monotonic()
    res = await run_load(plan)
    # 6 tokens at 50 steps/s, not at the per-stream rate of 1/s.
    assert time.monotonic() - started < 3
    assert res.errors == 0
    assert res.tokens == 18
    # Streams that joined together share one stamp per step: fewer steps than tokens.
    assert 6 <= res.last.count < 18
    assert res.last.max_ms == res.transit.max_ms
    # The same bytes as the per-stream timer gives (stamps masked).
    steady = await aiohttp_server(create_app(Config(rate_per_s=500.0, created_unix_s=1)))
    plain = await run_load(
        LoadPlan(**{**_fields(plan), "url": str(steady.make_url("")).rstrip("/")})
    )
    assert plain.body_sha256 == res.body_sha256


async def test_lockstep_stamps_equal_within_a_step(aiohttp_client):
    import asyncio

    from bench.backend import BackendConfig as Config

    client = await aiohttp_client(create_app(Config(step_rate_per_s=40.0)))
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 4}
    a, b = await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(2)))
    raw_a, raw_b = await a.read(), await b.read()
    stamps = [[int(json.loads(e.data)["bench_send_ns"]) for e in SseDecoder(1 << 20).feed(raw)
               if b"bench_send_ns" in e.data.encode()] for raw in (raw_a, raw_b)]  # fmt: skip
    assert len(stamps[0]) == len(stamps[1]) == 4
    assert set(stamps[0]) & set(stamps[1])  # at least one step carried both streams


async def test_a_request_can_slow_its_own_stream(aiohttp_client):
    client = await aiohttp_client(create_app(BackendConfig(rate_per_s=1000.0)))
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 3,
            "bench_rate_per_s": 10}  # fmt: skip
    started = time.monotonic()
    slow = await (await client.post("/v1/chat/completions", json=body)).read()
    assert time.monotonic() - started >= 0.29
    fast = await (await client.post("/v1/chat/completions",
                                    json={**body, "bench_rate_per_s": 0})).read()  # fmt: skip
    assert mask_stamps(slow) == mask_stamps(fast)
    bad = await client.post("/v1/chat/completions", json={**body, "bench_rate_per_s": "x"})
    assert bad.status == 400


def test_passthrough_runs_on_either_loop():
    import asyncio

    import uvloop

    from bench.passthrough import new_loop

    for name, kind in (("asyncio", asyncio.AbstractEventLoop), ("uvloop", uvloop.Loop)):
        loop = new_loop(name)
        try:
            assert isinstance(loop, kind)
        finally:
            loop.close()


async def test_tokens_per_write_sends_k_chunks_at_once_at_the_same_rate(aiohttp_client):
    """Each write carries K content chunks stamped alike; the answer's bytes do not change."""
    burst = BackendConfig(rate_per_s=200.0, default_max_tokens=5, created_unix_s=1_718_000_000,
                          tokens_per_write=3)  # fmt: skip
    body = {"messages": [{"role": "user", "content": "same"}], "stream": True, "max_tokens": 7}
    started_ns = time.monotonic_ns()
    raw = await _stream(aiohttp_client, create_app(burst), body)
    plain = await _stream(aiohttp_client, create_app(CONFIG), body)
    assert mask_stamps(raw) == mask_stamps(plain)
    events = SseDecoder(1 << 20).feed(raw)
    stamps = [int(json.loads(e.data)["bench_send_ns"]) for e in events[1:8]]
    assert stamps[0] == stamps[1] == stamps[2] < stamps[3] == stamps[4] == stamps[5] < stamps[6]
    # Each write leaves on the deadline of its last chunk: 3, 6 and 7 periods of 5 ms.
    assert stamps[0] - started_ns >= 3 * 5_000_000
    assert stamps[3] - started_ns >= 6 * 5_000_000
    assert stamps[6] - started_ns >= 7 * 5_000_000
