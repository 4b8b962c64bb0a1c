"""Load generator: C concurrent streams against any base URL, timing every token client-side.

Each stream sends chat completion requests one after another to
``{url}/v1/chat/completions``. Per received token chunk (one carrying the
backend's ``bench_send_ns`` stamp) it records transit (receive time minus the
embedded send time, both CPU-wide CLOCK_MONOTONIC), and per stream the gaps
between chunks and the time to first token. All chunks decoded from one
socket read share that read's receive stamp.

Two ways to bound a run:

- window (default): streams start staggered over half the warm-up, then only
  tokens received inside ``[warmup, warmup + duration)`` count; at the
  window's end every stream is cancelled. The first request of stream k asks
  for ``(k + 1) / C`` of ``max_tokens``, so request ends spread evenly over time.
- count (``--requests K``): every stream completes K requests; everything counts.

``--cpu-pid NAME=PID`` reads that process's CPU time (``/proc/<pid>/stat``) at
the start and end of the window. ``--verify`` hashes every complete response
body with the stamp digits zeroed, for byte-identity checks across targets.
Prints one JSON object (``LoadResult``) on stdout.

The client runs on uvloop where it is installed. SSE parsing is minimal on
purpose (events end in ``\\n\\n``, as the bench backend writes them; the stamp is
found with ``bytes.find``): the client must stay cheap so it is never the
bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

__all__ = ["LoadPlan", "LoadResult", "mask_stamps", "run_load"]

from bench.backend import STAMP_DIGITS, STAMP_FIELD
from bench.procstat import read_cpu
from bench.result import LoadResult
from bench.stats import EMPTY, summarize_ns

_STAMP_RE = re.compile(re.escape(STAMP_FIELD) + rb"\d{%d}" % STAMP_DIGITS)
_MASKED_STAMP = STAMP_FIELD + b"0" * STAMP_DIGITS
_MAX_ERROR_SAMPLES = 5


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What to run."""

    url: str
    """Base URL of the target (no trailing slash)."""
    streams: int
    """Concurrent streams."""
    max_tokens: int
    """Tokens asked per request."""
    duration_s: float = 10.0
    """Measured window (window mode)."""
    warmup_s: float = 1.0
    """Time before the window opens; streams start staggered over its first half."""
    requests: int = 0
    """Requests per stream (count mode); 0 selects window mode."""
    usage: str = "none"
    """``none``, ``all`` or ``alternate`` (odd streams): which ask ``include_usage``."""
    verify: bool = False
    """Hash every complete body (stamps masked)."""
    cpu_pids: tuple[tuple[str, int], ...] = ()
    """Processes whose CPU time is measured over the window, by name."""
    label: str = "bench"
    """Prompt prefix; the same label gives the same answers."""
    model: str = "bench-model"
    """``model`` in the request body."""
    timeout_s: float = 120.0
    """Hard limit on the whole run."""
    steps: bool = False
    """Also keep, per send stamp (a lockstep step), the transit of its last token received."""


def mask_stamps(body: bytes) -> bytes:
    """``body`` with every send-stamp's digits replaced by zeros (same length)."""
    return _STAMP_RE.sub(_MASKED_STAMP, body)


@dataclass(slots=True)
class _Recorder:
    """Samples of one run; shared by all streams (one event loop, no locks)."""

    window_start_ns: int
    window_end_ns: int
    transit_ns: list[int] = field(default_factory=list)
    gap_ns: list[int] = field(default_factory=list)
    ttft_ns: list[int] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    digests: dict[tuple[int, int], bytes] = field(default_factory=dict)
    last_ns: dict[int, int] | None = None

    def error(self, message: str) -> None:
        self.errors += 1
        if len(self.error_samples) < _MAX_ERROR_SAMPLES:
            self.error_samples.append(message)


def _request_body(plan: LoadPlan, stream: int, index: int, max_tokens: int) -> bytes:
    body: dict[str, Any] = {
        "model": plan.model,
        "messages": [
            {
                "role": "user",
                "content": f"{plan.label} stream {stream} request {index}: "
                "explain why prefill and decode are measured apart.",
            },
        ],
        "stream": True,
        "max_tokens": max_tokens,
    }
    if plan.usage == "all" or (plan.usage == "alternate" and stream % 2 == 1):
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


async def _one_request(
    session: aiohttp.ClientSession,
    plan: LoadPlan,
    rec: _Recorder,
    stream: int,
    index: int,
    max_tokens: int,
) -> None:
    """Send one request and read its stream to the end, recording every token."""
    clock = time.monotonic_ns
    win_start, win_end = rec.window_start_ns, rec.window_end_ns
    field_len = len(STAMP_FIELD)
    steps = rec.last_ns
    raw: list[bytes] | None = [] if plan.verify else None
    body = _request_body(plan, stream, index, max_tokens)
    sent_ns = clock()
    async with session.post(
        plan.url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    ) as resp:
        if resp.status != 200:
            text = (await resp.read())[:200].decode(errors="replace")
            rec.error(f"status {resp.status}: {text}")
            return
        content = resp.content
        buf = b""
        prev_ns = 0
        while True:
            chunk = await content.readany()
            now_ns = clock()
            if not chunk:
                break
            if raw is not None:
                raw.append(chunk)
            buf += chunk
            start = 0
            while True:
                end = buf.find(b"\n\n", start)
                if end < 0:
                    break
                at = buf.find(STAMP_FIELD, start, end)
                if at >= 0:
                    send_ns = int(buf[at + field_len : at + field_len + STAMP_DIGITS])
                    if win_start <= now_ns < win_end:
                        rec.transit_ns.append(now_ns - send_ns)
                        if steps is not None:
                            steps[send_ns] = now_ns - send_ns  # receive order: the last wins
                        if prev_ns:
                            rec.gap_ns.append(now_ns - prev_ns)
                        else:
                            rec.ttft_ns.append(now_ns - sent_ns)
                    prev_ns = now_ns
                start = end + 2
            buf = buf[start:]
    rec.completed += 1
    if raw is not None:
        rec.digests[(stream, index)] = hashlib.sha256(mask_stamps(b"".join(raw))).digest()


async def _stream_loop(
    session: aiohttp.ClientSession, plan: LoadPlan, rec: _Recorder, stream: int
) -> None:
    window_mode = plan.requests == 0
    if window_mode:
        await asyncio.sleep(stream * plan.warmup_s / 2 / plan.streams)
    index = 0
    while window_mode or index < plan.requests:
        n = plan.max_tokens
        if window_mode and index == 0:
            n = max(1, plan.max_tokens * (stream + 1) // plan.streams)
        try:
            await _one_request(session, plan, rec, stream, index, n)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            rec.error(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.05)  # do not spin on a target that refuses
        index += 1


def _cpu_now(pids: tuple[tuple[str, int], ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, pid in pids:
        try:
            out[name] = read_cpu(pid).total_s
        except OSError:
            out[name] = float("nan")
    return out


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def run_load(plan: LoadPlan) -> LoadResult:
    """Run the plan to its end (window closed or every request done)."""
    window_mode = plan.requests == 0
    t0_ns = time.monotonic_ns()
    if window_mode:
        win_start = t0_ns + int(plan.warmup_s * 1e9)
        win_end = win_start + int(plan.duration_s * 1e9)
    else:
        win_start, win_end = 0, 2**63 - 1
    rec = _Recorder(window_start_ns=win_start, window_end_ns=win_end)
    if plan.steps:
        rec.last_ns = {}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    async with (
        asyncio.timeout(plan.timeout_s),
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
    ):
        if window_mode:
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(_stream_loop(session, plan, rec, k)) for k in range(plan.streams)
                ]
                await asyncio.sleep(max(0.0, (win_start - time.monotonic_ns()) / 1e9))
                cpu0, own0, w0 = _cpu_now(plan.cpu_pids), _own_cpu_s(), time.monotonic_ns()
                await asyncio.sleep(max(0.0, (win_end - time.monotonic_ns()) / 1e9))
                cpu1, own1, w1 = _cpu_now(plan.cpu_pids), _own_cpu_s(), time.monotonic_ns()
                for t in tasks:
                    t.cancel()
        else:
            cpu0, own0, w0 = _cpu_now(plan.cpu_pids), _own_cpu_s(), time.monotonic_ns()
            async with asyncio.TaskGroup() as tg:
                for k in range(plan.streams):
                    tg.create_task(_stream_loop(session, plan, rec, k))
            cpu1, own1, w1 = _cpu_now(plan.cpu_pids), _own_cpu_s(), time.monotonic_ns()
    digest = ""
    if plan.verify:
        h = hashlib.sha256()
        for key in sorted(rec.digests):
            h.update(rec.digests[key])
        digest = h.hexdigest()
    return LoadResult(
        tokens=len(rec.transit_ns),
        requests_completed=rec.completed,
        errors=rec.errors,
        window_s=(w1 - w0) / 1e9,
        transit=summarize_ns(rec.transit_ns),
        ttft=summarize_ns(rec.ttft_ns),
        gap=summarize_ns(rec.gap_ns),
        cpu_s={name: cpu1[name] - cpu0[name] for name in cpu0},
        loadgen_cpu_s=own1 - own0,
        body_sha256=digest,
        error_samples=tuple(rec.error_samples),
        last=summarize_ns(rec.last_ns.values()) if rec.last_ns is not None else EMPTY,
    )


def _pid_arg(value: str) -> tuple[str, int]:
    name, sep, pid = value.partition("=")
    if not sep or not name or not pid.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=PID, got {value!r}")
    return name, int(pid)


def parse_plan(argv: Sequence[str] | None = None) -> LoadPlan:
    """The plan from command-line flags."""
    p = argparse.ArgumentParser(
        prog="python -m bench.loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", required=True, help="target base URL")
    p.add_argument("--streams", type=int, default=64, help="concurrent streams (default 64)")
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per request (default 200)")
    p.add_argument("--duration", type=float, default=10.0, help="window seconds (default 10)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before the window")
    p.add_argument("--requests", type=int, default=0, help="requests per stream (count mode)")
    p.add_argument(
        "--usage",
        choices=("none", "all", "alternate"),
        default="none",
        help="which streams ask for stream_options.include_usage",
    )
    p.add_argument("--verify", action="store_true", help="hash every body, stamps masked")
    p.add_argument(
        "--cpu-pid",
        type=_pid_arg,
        action="append",
        default=[],
        metavar="NAME=PID",
        help="measure this process's CPU over the window",
    )
    p.add_argument("--label", default="bench", help="prompt prefix")
    p.add_argument("--timeout", type=float, default=120.0, help="hard limit, seconds")
    p.add_argument("--steps", action="store_true", help="per lockstep step: its last token")
    a = p.parse_args(argv)
    if a.streams < 1 or a.max_tokens < 1 or a.requests < 0 or a.duration <= 0:
        p.error("--streams and --max-tokens must be >= 1, --duration > 0, --requests >= 0")
    return LoadPlan(
        url=str(a.url).rstrip("/"),
        streams=a.streams,
        max_tokens=a.max_tokens,
        duration_s=a.duration,
        warmup_s=max(0.0, a.warmup),
        requests=a.requests,
        usage=a.usage,
        verify=a.verify,
        cpu_pids=tuple(a.cpu_pid),
        label=a.label,
        timeout_s=a.timeout,
        steps=a.steps,
    )


def event_loop_runner() -> Callable[[Coroutine[Any, Any, LoadResult]], LoadResult]:
    """``uvloop.run`` where uvloop is installed, else ``asyncio.run``.

    On uvloop the client costs about half as much per token, so at 256 lockstep
    streams its own reading delays a step's tokens far less, and it takes less of
    the cores the targets share.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def main(argv: Sequence[str] | None = None) -> int:
    """Run one load and print its ``LoadResult`` as JSON on stdout."""
    plan = parse_plan(argv)
    result = event_loop_runner()(run_load(plan))
    json.dump(result.to_dict(), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
