"""Max rate: requests/s and tokens/s a target relays through one core, one token per read.

``python -m bench.maxrate --port P --url TARGET --streams N [--max-tokens K]`` is backend
and client in one process (pinned with ``--core`` to the core the target is not on). The
backend listens on ``P`` (the port the target was started with as its upstream); the
client opens ``N`` streams through the target. The loop is closed per stream: the backend
writes a stream's next token only when the client has received its previous one, so one
token is in flight per stream and every read the target makes carries one token; with
enough streams the target always has a read waiting, so its CPU saturates. Both ends are
bare asyncio protocols (``bench.maxrate_wire``, on uvloop where installed), so the load
costs far less than a Python target.

With ``--max-tokens K`` every request ends after K tokens as the steady backend's do
(finish, usage when asked, ``[DONE]``, the chunked terminator) and the stream's next
request follows at once, on the same connection where the target keeps it open: the
target saturates on whole requests. Every ended body is compared with the backend's.
Without it (0) every stream is one endless request: the per-token ceiling.

Prints one JSON object: tokens (and with K, requests ended) in the window, its length,
and the CPU seconds of every ``--cpu-pid`` process over it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from bench.maxrate_wire import Hub, Upstream
from bench.procstat import read_cpu


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
    requests: int = 0
    """Requests ended inside the window, each with its whole, identical body (0: endless)."""
    errors: int = 0
    """Requests that failed or whose body differed, over the whole run."""
    body_sha256: str = ""
    """sha256 of the backend's body if every ended body equalled it, else of one that
    did not; empty for endless streams."""
    error_samples: list[str] = field(default_factory=list)
    """The first few error messages."""
    connections: int = 0
    """Client connections opened to the target over the run (the streams, plus one per
    connection the target closed)."""


def _cpu(pids: Sequence[tuple[str, int]]) -> dict[str, float]:
    return {name: read_cpu(pid).total_s for name, pid in pids}


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def run(
    port: int, url: str, streams: int, duration_s: float, warmup_s: float,
    pids: Sequence[tuple[str, int]], max_tokens: int = 0,
) -> MaxRateResult:  # fmt: skip
    """Serve on ``port``, drive ``streams`` closed-loop streams through ``url``, measure."""
    loop = asyncio.get_running_loop()
    host, _, target_port = url.removeprefix("http://").rstrip("/").rpartition(":")
    hub = Hub(max_tokens, host, int(target_port), streams)
    server = await loop.create_server(lambda: Upstream(hub), "127.0.0.1", port)
    try:
        for k in range(streams):
            hub.connect(k, first=True)
        await asyncio.sleep(warmup_s)
        hub.counting = True
        cpu0, own0, w0 = _cpu(pids), _own_cpu_s(), time.monotonic()
        await asyncio.sleep(duration_s)
        cpu1, own1, w1 = _cpu(pids), _own_cpu_s(), time.monotonic()
        hub.counting = False
    finally:
        hub.running = False
        for task in list(hub.connecting):
            task.cancel()
        for stream in list(hub.streams.values()):
            if stream.transport is not None:
                stream.transport.close()
        server.close()
        await server.wait_closed()
    return MaxRateResult(
        tokens=hub.tokens_counted,
        window_s=w1 - w0,
        cpu_s={name: cpu1[name] - cpu0[name] for name in cpu0},
        own_cpu_s=own1 - own0,
        requests=hub.requests_counted,
        errors=hub.errors,
        body_sha256=hub.body_digest() if max_tokens else "",
        error_samples=list(hub.error_samples),
        connections=hub.connections,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one max-rate load and print its ``MaxRateResult`` as JSON on stdout."""
    p = argparse.ArgumentParser(prog="python -m bench.maxrate", description=__doc__)
    p.add_argument("--port", type=int, required=True, help="backend port (the target's upstream)")
    p.add_argument("--url", required=True, help="target base URL (http://HOST:PORT)")
    p.add_argument("--streams", type=int, default=64, help="closed-loop streams")
    p.add_argument("--duration", type=float, default=3.0, help="window seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before the window")
    p.add_argument("--max-tokens", type=int, default=0,
                   help="tokens per request, then the next; 0: endless streams")  # fmt: skip
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
    if a.max_tokens < 0:
        p.error("--max-tokens must be >= 0")
    if a.core >= 0:
        os.sched_setaffinity(0, {a.core})
    try:
        import uvloop  # the cheaper loop: the load side must outpace the target
    except ImportError:
        res = asyncio.run(run(a.port, a.url, a.streams, a.duration, a.warmup, pids, a.max_tokens))
    else:
        res = uvloop.run(run(a.port, a.url, a.streams, a.duration, a.warmup, pids, a.max_tokens))
    json.dump(asdict(res), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
