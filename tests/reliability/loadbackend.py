"""A fast, deterministic OpenAI-compatible backend for the load and soak tests.

``POST /v1/chat/completions`` with ``{"seed": S, "max_tokens": N, "stream": true}``
streams ``streams.stream_events(S, N)`` (plus the usage event when
``stream_options.include_usage`` is set) cut at seeded random points, so reads
split events, characters and CRLFs. ``X-Expected-Sha256`` announces the
sha256 of the bytes the client must receive (the usage event excluded: only
the proxy asks for it). ``pause_ms`` in the body sleeps between writes; with ``"hold": true`` the stream
stops after its first piece until ``POST /release`` (or 60 s), so a test can
have every stream open at once before any of them ends.

Run on its own (``python -m tests.reliability.loadbackend --port 0``) so the
backend does not share a core with the load client; it prints
``listening on PORT`` once ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys

from aiohttp import web

from tests.reliability.streams import random_splits, sha256, stream_events, visible_bytes

RELEASE: web.AppKey[asyncio.Event] = web.AppKey("release", asyncio.Event)


async def chat(request: web.Request) -> web.StreamResponse:
    """One deterministic stream."""
    body = json.loads(await request.read())
    seed = int(body.get("seed", 0))
    n = int(body.get("max_tokens", 16))
    pause_s = float(body.get("pause_ms", 0)) / 1000
    usage = bool((body.get("stream_options") or {}).get("include_usage"))
    events, usage_at = stream_events(seed, n, usage=usage)
    wire = b"".join(events)
    visible = visible_bytes(events, usage_at)
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "X-Expected-Sha256": sha256(visible),
            "X-Expected-Length": str(len(visible)),
        }
    )
    await resp.prepare(request)
    for i, piece in enumerate(random_splits(wire, random.Random(seed * 7919 + 1))):
        await resp.write(piece)
        if i == 0 and body.get("hold"):
            await asyncio.wait_for(request.app[RELEASE].wait(), 60)
        await asyncio.sleep(pause_s)
    await resp.write_eof()
    return resp


async def release(request: web.Request) -> web.Response:
    """Let every held stream go on."""
    request.app[RELEASE].set()
    return web.Response(text="released\n")


def make_app() -> web.Application:
    """The backend application."""
    app = web.Application()
    app[RELEASE] = asyncio.Event()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/release", release)
    return app


async def _main(port: int, keepalive_s: float) -> None:
    runner = web.AppRunner(make_app(), access_log=None, keepalive_timeout=keepalive_s)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    addr = runner.addresses[0]
    print(f"listening on {addr[1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    """Command line entry."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--keepalive", type=float, default=75.0,
                        help="close idle keep-alive connections after this many seconds")  # fmt: skip
    args = parser.parse_args()
    try:
        asyncio.run(_main(args.port, args.keepalive))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
