"""The seed's two scenarios, run through the proxy and measured from its own records.

Stutter: ``n`` streams decoding, then one long prompt arrives; measured from
the proxy's token timelines: the worst gap an existing stream saw while the
long prompt was prefilled, the existing streams' token rate meanwhile, the
long request's TTFT. Single: one request alone, the seed's first table.

The ``n`` streams are read by a child process (``python -m proxy.scenarios``,
at a lower priority), so the proxy's process does only what a proxy does and
its stamps are not delayed by the load generator's own work.

A stamp is late by however long its process waited for a CPU, so the stutter
run also reports how long the proxy, the backend and the stream reader were
runnable but not running while the long prompt was served (Linux schedstat).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from proxy.timeline.tokenlog import TokenLog

Progress = Callable[[str], None]

_CLIENT_NICE = 10


@dataclass(frozen=True, slots=True)
class CpuWait:
    """How long the processes of a run waited for a CPU while the long prompt was served.

    Time runnable but not running, summed over a process's threads; None where
    the kernel does not tell (no ``/proc/PID/task/*/schedstat``). Every stamp
    the proxy takes, and every token the backend writes, can be late by up to
    its process's wait. Other jobs on the machine make it grow; so do the run's
    own processes when they all wake for a step's tokens on a 2-core machine.
    """

    interval_s: float
    """The interval measured: from sending the long prompt to the end of its answer."""
    proxy_s: float | None
    """The proxy's process (the caller's; it also sends the long prompt)."""
    backend_s: float | None
    """The backend's process, when its pid was given."""
    client_s: float | None
    """The child process reading the existing streams."""


def run_queue_wait_ns(pid: int) -> int | None:
    """Nanoseconds the threads of ``pid`` have spent runnable, waiting for a CPU; None: unknown."""
    total, seen = 0, False
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
        seen = True
    return total if seen else None


class _WaitMeter:
    """Run-queue waits of the proxy, backend and client between :meth:`start` and :meth:`stop`."""

    def __init__(self, proxy: int, backend: int | None, client: int) -> None:
        self._pids = (proxy, backend, client)
        self._t0_ns = 0
        self._w0: tuple[int | None, ...] = ()

    def _waits(self) -> tuple[int | None, ...]:
        return tuple(None if p is None else run_queue_wait_ns(p) for p in self._pids)

    def start(self) -> None:
        self._t0_ns = time.monotonic_ns()
        self._w0 = self._waits()

    def stop(self) -> CpuWait:
        interval_s = (time.monotonic_ns() - self._t0_ns) / 1e9
        proxy, backend, client = (
            None if a is None or b is None else (b - a) / 1e9
            for a, b in zip(self._w0, self._waits(), strict=True)
        )
        return CpuWait(interval_s, proxy, backend, client)


@dataclass(frozen=True, slots=True)
class StutterMeasurement:
    """What the proxy saw when one long prompt joined ``streams`` decoding streams."""

    streams: int
    """Existing streams decoding when the long prompt arrived."""
    long_request_id: str
    """Request id of the long prompt."""
    steady_gap_s: float
    """Median gap of the existing streams before the long prompt arrived."""
    worst_gap_s: float
    """Median over existing streams of each stream's worst gap during the prefill window."""
    worst_gap_max_s: float
    """Largest such gap of any existing stream."""
    token_rate_per_s: float
    """Median over existing streams of tokens received per second during the window."""
    ttft_s: float
    """The long request's time to first token, as the proxy recorded it."""
    window_s: float
    """The long request's prefill window at the proxy: forwarded to first token."""
    cpu_wait: CpuWait
    """How long the processes waited for a CPU while the long prompt was served."""


@dataclass(frozen=True, slots=True)
class SingleMeasurement:
    """One request alone: the seed's first table, measured at the proxy."""

    output_tokens: int
    """Output events received."""
    ttft_s: float
    """Arrival to first token."""
    tpot_s: float
    """Mean time per output token after the first."""
    e2e_s: float
    """Arrival to end of stream."""


def chat_body(prompt_tokens: int, max_tokens: int) -> dict[str, object]:
    """A streamed chat request whose prompt length the simulator takes as given."""
    return {
        "model": "tokenstamp-sim",
        "messages": [{"role": "user", "content": "tell me a story"}],
        "stream": True,
        "max_tokens": max_tokens,
        "sim_prompt_tokens": prompt_tokens,
    }


async def stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, object], request_id: str
) -> int:
    """POST one streamed chat completion through ``url`` and read it to its end; its bytes."""
    async with session.post(
        url + "/v1/chat/completions", json=body, headers={"X-Request-Id": request_id}
    ) as r:
        if r.status != 200:
            raise RuntimeError(f"{request_id}: HTTP {r.status}: {(await r.text())[:200]}")
        n = 0
        async for chunk in r.content.iter_any():
            n += len(chunk)
        return n


async def _streams(url: str, ids: list[str], body: dict[str, object]) -> None:
    """Run the streams to their end (the child process's job)."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        await asyncio.gather(*(stream(session, url, body, rid) for rid in ids))


async def _spawn_streams(
    url: str, ids: list[str], body: dict[str, object]
) -> asyncio.subprocess.Process:
    spec = json.dumps({"url": url, "ids": ids, "body": body})
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "demo.scenarios", spec, stdin=asyncio.subprocess.DEVNULL
    )


async def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.01)


async def run_stutter(
    proxy_url: str,
    log: TokenLog,
    *,
    label: str,
    streams: int = 40,
    prompt_tokens: int = 4000,
    backend_pid: int | None = None,
    progress: Progress = lambda _: None,
) -> StutterMeasurement:
    """Start ``streams`` streams, let them settle, send the long prompt, measure.

    The CPU wait counted as the proxy's is this process's (the proxy runs here
    in the demo); ``backend_pid`` names the backend's process for the same account.
    """
    ids = [f"{label}-stream-{i:02d}" for i in range(streams)]
    long_id = f"{label}-long-prompt"
    # Enough output that every stream is still decoding well after the long
    # prompt's first token, even on a busy machine.
    body = chat_body(prompt_tokens=64, max_tokens=240)

    def tokens(rid: str) -> int:
        tl = log.timelines.get(rid)
        return len(tl.token_ns) if tl else 0

    progress(f"{label}: starting {streams} streams")
    child = await _spawn_streams(proxy_url, ids, body)
    try:
        await _wait(lambda: all(tokens(rid) >= 12 for rid in ids), 60,
                    f"{streams} streams to be decoding")  # fmt: skip
        progress(f"{label}: {streams} streams decoding; sending a {prompt_tokens:,}-token prompt")
        meter = _WaitMeter(os.getpid(), backend_pid, child.pid)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            meter.start()
            await stream(session, proxy_url, chat_body(prompt_tokens, 4), long_id)
            cpu_wait = meter.stop()
        progress(f"{label}: long prompt answered; finishing the streams")
        if await child.wait() != 0:
            raise RuntimeError(f"{label}: the stream client failed")
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    long_tl = log.timelines[long_id]
    assert long_tl.forwarded_ns is not None
    assert long_tl.first_token_ns is not None
    tf, t1 = long_tl.forwarded_ns, long_tl.first_token_ns
    steady: list[int] = []
    worst: list[int] = []
    rates: list[float] = []
    for rid in ids:
        tl = log.timelines[rid]
        gaps = tl.gaps_ns()
        steady.extend(b - a for a, b in gaps if b <= tf)
        # Gaps that overlap the prefill window (forwarded .. first token).
        during = [b - a for a, b in gaps if b > tf and a < t1]
        if during:
            worst.append(max(during))
        in_window = sum(1 for t in tl.token_ns if tf < t <= t1)
        rates.append(in_window / ((t1 - tf) / 1e9))
    if not worst:
        raise RuntimeError("no existing stream had a gap during the prefill window")
    return StutterMeasurement(
        streams=streams,
        long_request_id=long_id,
        steady_gap_s=statistics.median(steady[-streams * 8 :]) / 1e9,
        worst_gap_s=statistics.median(worst) / 1e9,
        worst_gap_max_s=max(worst) / 1e9,
        token_rate_per_s=statistics.median(rates),
        ttft_s=0.0,  # filled from the proxy's request record by the caller
        window_s=(t1 - tf) / 1e9,
        cpu_wait=cpu_wait,
    )


async def run_single(
    proxy_url: str,
    log: TokenLog,
    *,
    prompt_tokens: int,
    output_tokens: int,
    progress: Progress = lambda _: None,
) -> SingleMeasurement:
    """One request alone on an idle engine."""
    rid = "single-request"
    progress(f"single: one request, {prompt_tokens:,}-token prompt, {output_tokens} tokens out")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await stream(session, proxy_url, chat_body(prompt_tokens, output_tokens), rid)
    tl = log.timelines[rid]
    assert tl.first_token_ns is not None
    assert tl.end_ns is not None
    n = len(tl.token_ns)
    return SingleMeasurement(
        output_tokens=n,
        ttft_s=0.0,  # filled from the proxy's request record by the caller
        tpot_s=(tl.token_ns[-1] - tl.token_ns[0]) / 1e9 / max(1, n - 1),
        e2e_s=0.0,
    )


def _child_main(spec_json: str) -> int:
    # The reader stands in for the users and its own latency is not measured.
    # Less favoured, it does not hold up the proxy, whose stamps are, when both
    # wake for the same step's tokens on a small machine.
    with contextlib.suppress(OSError):
        os.nice(_CLIENT_NICE)
    spec = json.loads(spec_json)
    asyncio.run(_streams(spec["url"], spec["ids"], spec["body"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1]))
