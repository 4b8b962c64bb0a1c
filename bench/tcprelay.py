"""The floor of a Python proxy: a raw TCP relay, one callback and one write per read.

Each client connection gets its own upstream connection; bytes go both ways
unchanged, with no HTTP parsing, no headers, no observation. Per read the
event loop calls ``data_received`` once and the relay writes the bytes to the
other side: the least any proxy built on asyncio protocols can run per token.
Whatever the bare aiohttp pass-through costs beyond this is its HTTP
machinery; whatever this costs beyond nginx is the event loop and the
interpreter, which no change inside the proxy's callbacks can remove.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import cast
from urllib.parse import urlsplit

from bench.passthrough import new_loop


class _Side(asyncio.Protocol):
    """One end of a relayed connection: what it reads goes to ``peer``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []
        self.connecting: asyncio.Task[None] | None = None  # held: a task needs a reference

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
            return
        peer.transport.write(data)

    def pause_writing(self) -> None:
        # The other side's buffer is full: stop reading from the one that fills it.
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def eof_received(self) -> bool | None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


def _client_side(host: str, port: int) -> _Side:
    """A client connection; its upstream connection opens at once."""
    side = _Side()

    async def connect() -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(_Side, host, port)
        except OSError:
            if side.transport is not None:
                side.transport.close()
            return
        up.peer, side.peer = side, up
        assert up.transport is not None
        for data in side.pending:
            up.transport.write(data)
        side.pending.clear()

    side.connecting = asyncio.get_running_loop().create_task(connect())
    return side


async def serve(upstream: str, listen: str) -> None:
    """Relay every connection to ``listen`` to the upstream until cancelled."""
    target = urlsplit(upstream)
    host, port = target.hostname or "127.0.0.1", target.port or 80
    lhost, _, lport = listen.rpartition(":")
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _client_side(host, port), lhost or "127.0.0.1", int(lport)
    )
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.tcprelay --upstream URL --listen HOST:PORT [--loop uvloop]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.tcprelay", description=__doc__)
    parser.add_argument("--upstream", required=True, help="backend base URL")
    parser.add_argument("--listen", default="127.0.0.1:8082", help="HOST:PORT to listen on")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args(argv)
    if not str(args.listen).rpartition(":")[2].isdigit():
        parser.error(f"--listen: expected HOST:PORT, got {args.listen!r}")
    loop = new_loop(args.loop)
    try:
        loop.run_until_complete(serve(args.upstream, args.listen))
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
