"""The bare pass-through: the least an aiohttp reverse proxy does, as the benchmark's baseline.

Same forwarding as tokenstamp without any observation: read the request body,
send it upstream on a pooled ``ClientSession`` (``auto_decompress=False``),
start the response with the upstream's status and end-to-end headers, then
copy the body read by read (``readany()`` then ``write()``). Whatever CPU
tokenstamp spends beyond this per token is the price of watching the stream.
``--loop uvloop`` runs the same code on uvloop (installed with tokenstamp on
Linux and macOS), so each loop's proxy has its own baseline.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.edge.headers import HOP_BY_HOP

# The same hop-by-hop rule as the proxy (RFC 9110 section 7.6.1), plus what the
# client library recomputes.
_HOP_BY_HOP = HOP_BY_HOP
_REQUEST_DROP = _HOP_BY_HOP | {"host", "content-length"}


def _copy(headers: CIMultiDictProxy[str], drop: frozenset[str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        if k.lower() not in drop:
            out.add(k, v)
    return out


UPSTREAM: web.AppKey[str] = web.AppKey("bench_upstream", str)
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("bench_session", aiohttp.ClientSession)


async def forward(request: web.Request) -> web.StreamResponse:
    """Forward one request and copy the answer back unchanged."""
    session = request.app[SESSION]
    body = await request.read()
    async with session.request(
        request.method,
        request.app[UPSTREAM] + str(request.rel_url),
        headers=_copy(request.headers, _REQUEST_DROP),
        data=body or None,
        allow_redirects=False,
    ) as up:
        resp = web.StreamResponse(
            status=up.status, reason=up.reason, headers=_copy(up.headers, _HOP_BY_HOP)
        )
        await resp.prepare(request)
        content = up.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                await resp.write(chunk)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away; leaving the block closes the upstream response
        return resp


def create_app(upstream: str) -> web.Application:
    """The pass-through application for one upstream base URL."""
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
        app[SESSION] = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, trust_env=False
        )
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def new_loop(name: str) -> asyncio.AbstractEventLoop:
    """A fresh event loop of the named kind: ``asyncio`` (the default loop) or ``uvloop``."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise SystemExit(
                "--loop uvloop: uvloop is not installed (pip install uvloop)"
            ) from None
        return uvloop.new_event_loop()
    if name == "asyncio":
        return asyncio.new_event_loop()
    raise ValueError(f"unknown loop {name!r} (asyncio or uvloop)")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.passthrough --upstream URL --listen HOST:PORT [--loop uvloop]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.passthrough", description=__doc__)
    parser.add_argument("--upstream", required=True, help="backend base URL")
    parser.add_argument("--listen", default="127.0.0.1:8081", help="HOST:PORT to listen on")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop (default asyncio)",
    )
    args = parser.parse_args(argv)
    host, _, port = str(args.listen).rpartition(":")
    if not port.isdigit():
        parser.error(f"--listen: expected HOST:PORT, got {args.listen!r}")
    web.run_app(
        create_app(args.upstream),
        host=host or "127.0.0.1",
        port=int(port),
        print=None,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=1.0,
        loop=new_loop(args.loop),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
