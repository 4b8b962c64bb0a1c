"""Max rate: tokens/s a target relays through one core, one token per read.

``python -m bench.maxrate --port P --url TARGET --streams N`` is backend and
client in one process (pinned with ``--core`` to the core the target is not
on). The backend listens on ``P`` (the port the target was started with as its
upstream) and answers every request with an endless SSE stream, one token
chunk per write; the client opens ``N`` streams through the target. The loop
is closed per stream: the backend writes a stream's next token only when the
client has received its previous one, so one token is in flight per stream and
every read the target makes carries one token; with enough streams the target
always has a read waiting, so its CPU saturates. Both sides are bare asyncio
protocols (on uvloop where installed), so the load costs far less per token
than a Python target.

Prints one JSON object: tokens received in the window, its length, and the
CPU seconds of every ``--cpu-pid`` process over it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import cast

from bench.backend import STAMP_FIELD, Answer, ChunkFormat
from bench.procstat import read_cpu

_KEY_RE = re.compile(rb"maxrate stream (\d+)")
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_CYCLE = 32


def _chunked(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


@dataclass(frozen=True, slots=True)
class MaxRateResult:
    """What one max-rate load measured."""

    tokens: int
    """Token chunks received inside the window."""
    window_s: float
    """Length of the window, seconds."""
    cpu_s: dict[str, float]
    """CPU seconds each ``--cpu-pid`` process used in the window."""
    own_cpu_s: float
    """CPU seconds this process (backend and client) used in the window."""


class _Hub:
    """Pairs each client stream with its backend stream and counts tokens."""

    def __init__(self) -> None:
        fmt = ChunkFormat(Answer(True, False, _CYCLE, "bench-model", "maxrate"), 0)
        self.role = _chunked(fmt.role())
        self.tokens = [_chunked(fmt.content(i, time.monotonic_ns())) for i in range(_CYCLE)]
        self.servers: dict[int, _Server] = {}
        self.counting = False
        self.received = 0


class _Server(asyncio.Protocol):
    """Backend side of one upstream connection: writes a token when its client asks."""

    def __init__(self, hub: _Hub) -> None:
        self.hub = hub
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.key = -1
        self.sent = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        if self.key >= 0:
            return  # the request is read; nothing else is expected
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        m = _KEY_RE.search(self.buf)
        if m is None:
            return  # wait for the body, which names the stream
        self.key = int(m.group(1))
        self.hub.servers[self.key] = self
        assert self.transport is not None
        self.transport.write(_HEAD + self.hub.role)
        self.send()

    def send(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.hub.tokens[self.sent % _CYCLE])
            self.sent += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.hub.servers.pop(self.key, None)
        self.transport = None


class _Client(asyncio.Protocol):
    """Client side of one stream: counts tokens and asks for the next one per token."""

    def __init__(self, hub: _Hub, key: int, request: bytes) -> None:
        self.hub, self.key, self.request = hub, key, request
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(self.request)

    def data_received(self, data: bytes) -> None:
        seen = self.tail + data
        n = seen.count(STAMP_FIELD)
        self.tail = seen[-len(STAMP_FIELD) + 1 :]
        if not n:
            return
        hub = self.hub
        if hub.counting:
            hub.received += n
        server = hub.servers.get(self.key)
        if server is not None:
            for _ in range(n):
                server.send()


def _request(host: str, key: int) -> bytes:
    body = json.dumps({
        "model": "bench-model", "stream": True, "max_tokens": 100_000,
        "messages": [{"role": "user", "content": f"maxrate stream {key}"}],
    }).encode()  # fmt: skip
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _cpu(pids: Sequence[tuple[str, int]]) -> dict[str, float]:
    return {name: read_cpu(pid).total_s for name, pid in pids}


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def run(
    port: int, url: str, streams: int, duration_s: float, warmup_s: float,
    pids: Sequence[tuple[str, int]],
) -> MaxRateResult:  # fmt: skip
    """Serve on ``port``, drive ``streams`` closed-loop streams through ``url``, measure."""
    loop = asyncio.get_running_loop()
    hub = _Hub()
    server = await loop.create_server(lambda: _Server(hub), "127.0.0.1", port)
    host, _, target_port = url.removeprefix("http://").rstrip("/").rpartition(":")
    clients = []
    try:
        for k in range(streams):
            transport, _ = await loop.create_connection(
                functools.partial(_Client, hub, k, _request(host, k)), host, int(target_port)
            )
            clients.append(transport)
        await asyncio.sleep(warmup_s)
        hub.counting = True
        cpu0, own0, w0 = _cpu(pids), _own_cpu_s(), time.monotonic()
        await asyncio.sleep(duration_s)
        cpu1, own1, w1 = _cpu(pids), _own_cpu_s(), time.monotonic()
        hub.counting = False
    finally:
        for t in clients:
            t.close()
        server.close()
        await server.wait_closed()
    return MaxRateResult(
        tokens=hub.received,
        window_s=w1 - w0,
        cpu_s={name: cpu1[name] - cpu0[name] for name in cpu0},
        own_cpu_s=own1 - own0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one max-rate load and print its ``MaxRateResult`` as JSON on stdout."""
    p = argparse.ArgumentParser(prog="python -m bench.maxrate", description=__doc__)
    p.add_argument("--port", type=int, required=True, help="backend port (the target's upstream)")
    p.add_argument("--url", required=True, help="target base URL (http://HOST:PORT)")
    p.add_argument("--streams", type=int, default=64, help="closed-loop streams")
    p.add_argument("--duration", type=float, default=3.0, help="window seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before the window")
    p.add_argument("--core", type=int, default=-1, help="pin this process to that core")
    p.add_argument("--cpu-pid", action="append", default=[], metavar="NAME=PID",
                   help="process whose CPU time is read over the window")  # fmt: skip
    a = p.parse_args(argv)
    pids = []
    for item in a.cpu_pid:
        name, _, pid = str(item).partition("=")
        if not name or not pid.isdigit():
            p.error(f"--cpu-pid: expected NAME=PID, got {item!r}")
        pids.append((name, int(pid)))
    if a.core >= 0:
        os.sched_setaffinity(0, {a.core})
    try:
        import uvloop  # the cheaper loop: the load side must outpace the target
    except ImportError:
        res = asyncio.run(run(a.port, a.url, a.streams, a.duration, a.warmup, pids))
    else:
        res = uvloop.run(run(a.port, a.url, a.streams, a.duration, a.warmup, pids))
    json.dump(asdict(res), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
