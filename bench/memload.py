"""Memory per open stream: open N slowly streaming streams through a target, read its RSS.

``python -m bench.memload --url URL --streams 1000 --rss-pid target=PID`` reads
each named process's resident set (``VmRSS`` of ``/proc/<pid>/status``), opens
``streams`` concurrent streams that each ask the backend for one token a
second (``bench_rate_per_s``), waits until every one has received its first
content token (all are open, through every layer of the target), lets them
settle, reads the resident sets again and closes everything. Prints one JSON
object: streams open, and per process the RSS before and with them open, KiB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import aiohttp

from bench.backend import STAMP_FIELD

_SLOW_RATE_PER_S = 1.0
_SETTLE_S = 1.0


@dataclass(frozen=True, slots=True)
class MemoryResult:
    """RSS of each process before and with the streams open."""

    streams_open: int
    """Streams that received their first token before the deadline."""
    rss_before_kib: dict[str, int]
    """Resident set before any stream was opened, KiB, by process name."""
    rss_open_kib: dict[str, int]
    """Resident set with the streams open, KiB, by process name."""
    open_s: float
    """Seconds until every stream was open (or the deadline passed)."""

    def kib_per_stream(self, name: str) -> float:
        """(RSS open - RSS before) / streams open, KiB; NaN without a sample."""
        if not self.streams_open or name not in self.rss_open_kib:
            return float("nan")
        return (self.rss_open_kib[name] - self.rss_before_kib[name]) / self.streams_open


def read_rss_kib(pid: int) -> int:
    """``VmRSS`` of a running process in KiB (proc(5)); ``OSError`` when it does not exist."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return parse_vmrss_kib(f.read())


def parse_vmrss_kib(status: str) -> int:
    """The ``VmRSS:`` line of a ``/proc/<pid>/status`` text, in KiB."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, _, unit = line.split(":", 1)[1].strip().partition(" ")
            if unit.strip().lower() != "kb":
                raise ValueError(f"VmRSS in unexpected unit: {line!r}")
            return int(value)
    raise ValueError("no VmRSS line (a kernel thread, or not a status file)")


async def _hold(
    session: aiohttp.ClientSession, url: str, k: int, opened: asyncio.Queue[int]
) -> None:
    body = {
        "model": "bench-model",
        "messages": [{"role": "user", "content": f"memory stream {k}"}],
        "stream": True,
        "max_tokens": 100_000,
        "bench_rate_per_s": _SLOW_RATE_PER_S,
    }
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        seen = b""
        while True:
            chunk = await resp.content.readany()
            if not chunk:
                raise ConnectionError("stream ended while held open")
            seen += chunk
            if STAMP_FIELD in seen:
                break
            seen = seen[-len(STAMP_FIELD) :]
        opened.put_nowait(k)
        while await resp.content.readany():
            pass


async def measure(
    url: str, streams: int, pids: Sequence[tuple[str, int]], timeout_s: float
) -> MemoryResult:
    """Open ``streams`` streams through ``url``; RSS of ``pids`` before and with them open."""
    before = {name: read_rss_kib(pid) for name, pid in pids}
    opened: asyncio.Queue[int] = asyncio.Queue()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)
    started_s = time.monotonic()
    count = 0
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.get_running_loop().create_task(_hold(session, url, k, opened))
                 for k in range(streams)]  # fmt: skip
        try:
            async with asyncio.timeout(timeout_s):
                while count < streams:
                    await opened.get()
                    count += 1
        except TimeoutError:
            pass
        open_s = time.monotonic() - started_s
        await asyncio.sleep(_SETTLE_S)
        with_open = {name: read_rss_kib(pid) for name, pid in pids}
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return MemoryResult(count, before, with_open, open_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one measurement and print its ``MemoryResult`` as JSON on stdout."""
    p = argparse.ArgumentParser(prog="python -m bench.memload", description=__doc__)
    p.add_argument("--url", required=True, help="target base URL")
    p.add_argument("--streams", type=int, default=1000, help="streams to hold open")
    p.add_argument("--rss-pid", action="append", default=[], metavar="NAME=PID",
                   help="process whose RSS is read")  # fmt: skip
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to open them all")
    a = p.parse_args(argv)
    pids = []
    for item in a.rss_pid:
        name, _, pid = str(item).partition("=")
        if not name or not pid.isdigit():
            p.error(f"--rss-pid: expected NAME=PID, got {item!r}")
        pids.append((name, int(pid)))
    res = asyncio.run(measure(str(a.url).rstrip("/"), a.streams, pids, a.timeout))
    json.dump(asdict(res), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
