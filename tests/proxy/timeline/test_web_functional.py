"""``/timeline`` over real sockets: off by default, the page and its feed, bounded, no secrets."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp

from proxy.timeline.web import MAX_FEEDS
from tests.conftest import Script

SECRET_PROMPT = "the-launch-code-is-0451-do-not-log"
SECRET_KEY = "sk-timeline-test-9f8e7d6c5b4a"


def sse(*texts: str) -> list[tuple[float, bytes]]:
    parts = [(0.0, b'data: {"id":"c1","model":"m","choices":[{"delta":{"role":"assistant"}}]}\n\n')]
    for t in texts:
        chunk = {"id": "c1", "model": "m", "choices": [{"delta": {"content": t}}]}
        parts.append((0.02, f"data: {json.dumps(chunk)}\n\n".encode()))
    usage = {"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 7}}
    parts.append((0.0, f"data: {json.dumps(usage)}\n\n".encode()))
    parts.append((0.0, b"data: [DONE]\n\n"))
    return parts


async def chat(session: aiohttp.ClientSession, url: str, rid: str) -> None:
    body = {
        "model": "llama-test",
        "stream": True,
        "messages": [{"role": "user", "content": SECRET_PROMPT}],
    }
    headers = {"Authorization": f"Bearer {SECRET_KEY}", "X-Request-Id": rid}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200
        await r.read()


async def read_events(resp: aiohttp.ClientResponse, n: int) -> list[dict]:
    events: list[dict] = []
    while len(events) < n:
        line = await asyncio.wait_for(resp.content.readline(), 10)
        assert line, "the feed ended"
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
    return events


async def ends(resp: aiohttp.ClientResponse) -> bool:
    """Read to the end of the stream (10 s at most); True once it ended."""
    async with asyncio.timeout(10):
        try:
            while await resp.content.readline():
                pass
        except aiohttp.ClientPayloadError:
            pass  # cut off rather than closed: ended all the same
    return True


async def test_off_by_default_with_a_message_saying_how_to_enable(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url)
    assert proxy.timeline is None
    async with aiohttp.ClientSession() as s:
        for path in ("/timeline", "/timeline/feed", "/timeline/snapshot", "/timeline/timeline.js"):
            async with s.get(proxy.admin_url + path) as r:
                assert r.status == 404, path
                text = await r.text()
                assert "--timeline" in text
                assert "TOKENSTAMP_TIMELINE=true" in text


async def test_page_and_assets_are_served_and_fetch_nothing_from_outside(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, timeline=True)
    async with aiohttp.ClientSession() as s:
        bodies = {}
        for path, kind in (
            ("/timeline", "text/html"),
            ("/timeline/timeline.js", "text/javascript"),
            ("/timeline/timeline.css", "text/css"),
        ):
            async with s.get(proxy.admin_url + path) as r:
                assert r.status == 200
                assert r.content_type == kind
                assert "connect-src 'self'" in r.headers["Content-Security-Policy"]
                bodies[path] = await r.text()
        async with s.get(proxy.admin_url + "/timeline/other.js") as r:
            assert r.status == 404
    for path, text in bodies.items():
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), path
    assert 'src="timeline/timeline.js"' in bodies["/timeline"]
    assert "<canvas" not in bodies["/timeline"]  # drawn by the script, one per backend


async def test_feed_streams_a_snapshot_then_deltas_without_secrets(upstream, proxy_factory):
    upstream.script = Script(sse("a", "b", "c", "d"))
    proxy = await proxy_factory(upstream.url, timeline=True, timeline_window_s=5.0)
    async with aiohttp.ClientSession() as s:
        await chat(s, proxy.url, "req-before")
        async with s.get(proxy.admin_url + "/timeline/feed") as feed:
            assert feed.status == 200
            assert feed.content_type == "text/event-stream"
            [snapshot] = await read_events(feed, 1)
            await chat(s, proxy.url, "req-during")
            deltas = []
            while not any(
                st["id"] == "req-during" and st["end_us"] is not None
                for d in deltas
                for b in d["backends"]
                for st in b["streams"]
            ):
                deltas += await read_events(feed, 1)
            raw = json.dumps([snapshot, *deltas])
        async with s.get(proxy.admin_url + "/timeline/snapshot") as r:
            whole = await r.json()
            raw += await r.text()

    assert snapshot["type"] == "snapshot"
    assert snapshot["window_s"] == 5.0
    [backend] = snapshot["backends"]
    assert backend["backend"]["name"] == "test-backend"
    [before] = backend["streams"]
    assert before["id"] == "req-before"
    assert len(before["ticks_us"]) == 4
    assert before["model"] == "llama-test"
    assert before["prompt_tokens"] == 7
    assert before["end_us"] is not None
    assert {d["type"] for d in deltas} == {"delta"}
    during = [st for d in deltas for st in d["backends"][0]["streams"] if st["id"] == "req-during"]
    assert sum(len(st["ticks_us"]) for st in during) == 4  # each stamp sent once
    assert all(st["id"] != "req-before" for d in deltas for st in d["backends"][0]["streams"])
    assert {st["id"] for st in whole["backends"][0]["streams"]} == {"req-before", "req-during"}
    # Metadata only: never the prompt, never a header value.
    assert SECRET_PROMPT not in raw
    assert SECRET_KEY not in raw
    assert "Bearer" not in raw
    assert "authorization" not in raw.lower()


async def test_readers_are_limited_and_feeds_end_when_the_proxy_stops(upstream, proxy_factory):
    proxy = await proxy_factory(upstream.url, timeline=True)
    async with aiohttp.ClientSession() as s:
        feeds = [await s.get(proxy.admin_url + "/timeline/feed") for _ in range(MAX_FEEDS)]
        assert [f.status for f in feeds] == [200] * MAX_FEEDS
        async with s.get(proxy.admin_url + "/timeline/feed") as extra:
            assert extra.status == 503
        for f in feeds:
            await read_events(f, 1)
        feeds.pop().close()
        async with asyncio.timeout(10):  # its handler notices at its next write
            while True:
                async with s.get(proxy.admin_url + "/timeline/feed") as again:
                    if again.status == 200:
                        break
                await asyncio.sleep(0.1)
        await proxy.close(drain_timeout_s=1.0)
        for f in feeds:  # each feed ends: no reader hangs on a stopped proxy
            assert await ends(f)
            f.close()
