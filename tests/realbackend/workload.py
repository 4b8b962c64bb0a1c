"""The stutter workload and the checks that compare the proxy with its client.

``stutter_run``: N streams decode through the proxy; once each has a baseline,
one long random prompt arrives; everything runs to its end. The client
(``loadclient``, a child process) stamps every read; the proxy's recorders
keep every stamp and record. ``Agreement`` sets the two side by side, event
by event.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.realbackend.client import Capture, Prompts, chat
from tests.realbackend.recorder import RecordedProxy
from tests.realbackend.sched import Boost, Contention, WaitMeter

REPO = Path(__file__).resolve().parents[2]


@dataclass
class StutterRun:
    """What the workload produced."""

    streams: list[Capture]
    """The short streams, as their client saw them."""
    long: Capture
    """The long prompt's request."""
    long_prompt_tokens: int
    """Its prompt size in the model's tokens (content only, no template)."""
    contention: Contention
    """How long the proxy, the client (and watched processes) waited for a CPU."""


async def run_client(
    plan: dict[str, Any], **watch: int | str
) -> tuple[dict[str, Capture], Contention]:
    """Run ``loadclient`` with ``plan`` in a child process; its captures by request id.

    The proxy (this process), the client and the processes in ``watch`` are
    measured for time spent waiting for a CPU; the proxy's thread and the
    client run at raised priority meanwhile (``Boost``).
    """
    # The pytest process holds a heap a running proxy would not: freeze it, so a
    # garbage collection during the run scans only what the run allocates.
    gc.collect()
    gc.freeze()
    with Boost(), WaitMeter(proxy="self", **watch) as meter:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.realbackend.loadclient",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=REPO,
        )  # fmt: skip
        try:
            out, err = await proc.communicate(json.dumps(plan).encode())
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"load client failed ({proc.returncode}): {err.decode()[-3000:]}")
    gc.unfreeze()
    result = json.loads(out)
    meter.add("client", result["run_queue_wait_ns"] / 1e9)
    caps = {k: Capture.from_dump(v) for k, v in result["captures"].items()}
    return caps, meter.result


async def stutter_run(
    proxy: RecordedProxy,
    prompts: Prompts,
    *,
    streams: int = 8,
    stream_tokens: int = 60,
    warm_events: int = 16,
    long_tokens: int = 1990,
    stagger_s: float = 0.03,
    tag: str = "run",
    watch: dict[str, int] | None = None,
    usage: bool = False,
) -> StutterRun:
    """Run the workload against ``proxy`` (client in its own process).

    ``watch``: more processes (name to pid) whose CPU waits are measured. ``usage``: the
    short streams ask for a usage chunk themselves (``stream_options.include_usage``).
    """
    long_text = prompts.text(long_tokens)
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    plan = {
        "url": proxy.url,
        "streams": [
            [f"{tag}-stream-{i}", chat(prompts.text(24), stream_tokens, **extra)]
            for i in range(streams)
        ],
        "stagger_s": stagger_s,
        "warm_events": warm_events,
        "long": [f"{tag}-long", chat(long_text, 4)],
    }
    caps, contention = await run_client(plan, **(watch or {}))
    return StutterRun(
        [caps[f"{tag}-stream-{i}"] for i in range(streams)],
        caps[f"{tag}-long"],
        prompts.count(long_text),
        contention,
    )


@dataclass
class Agreement:
    """The proxy's stamps against the client's, over a set of requests."""

    event_lags_s: list[float]
    """Per output event: arrival at the client's socket minus the proxy's read stamp."""
    seen_lags_s: list[float]
    """Per output event: the client's code getting it minus the proxy's read stamp
    (>= 0 by causality; the kernel's stamps of a read can be older than its last bytes)."""
    gap_diffs_s: list[float]
    """Per gap: client gap minus proxy gap."""
    ttft_diffs_s: list[float]
    """Per request: client TTFT minus proxy TTFT."""
    ingest_s: list[float]
    """Per request: the proxy's arrival stamp ``t0`` minus the client's send stamp.

    The part of the TTFT difference before the proxy's clock starts (accept,
    HTTP parsing, body read, a busy event loop); the rest is the first token's
    event lag."""
    mismatched: list[str]
    """Requests whose output event counts differ."""
    ttft_rows: list[str]
    """Per request: client and proxy TTFT, for the test output."""

    @staticmethod
    def p99(values: list[float]) -> float:
        """99th percentile of absolute values (inclusive method)."""
        if len(values) < 2:
            return abs(values[0]) if values else 0.0
        return statistics.quantiles([abs(v) for v in values], n=100, method="inclusive")[98]

    def table(self) -> str:
        """A short summary for the test output."""

        def ms(v: float) -> str:
            return f"{v * 1e3:7.3f}"

        rows = [
            ("event lag (client - proxy)", self.event_lags_s),
            ("  client code got it - proxy", self.seen_lags_s),
            ("gap difference", self.gap_diffs_s),
            ("TTFT difference", self.ttft_diffs_s),
            ("  of which before t0", self.ingest_s),
        ]
        out = [f"{'':30} {'n':>5} {'median ms':>10} {'p99 |ms|':>9} {'max |ms|':>9} {'>1 ms':>6}"]
        for name, vals in rows:
            if vals:
                med = statistics.median(vals)
                mx = max(abs(v) for v in vals)
                over = sum(1 for v in vals if abs(v) > 0.001)
                out.append(
                    f"{name:30} {len(vals):5} {ms(med):>10} {ms(self.p99(vals)):>9} {ms(mx):>9}"
                    f" {over:6}"
                )
        return "\n".join(out + self.ttft_rows)


def agreement(proxy: RecordedProxy, caps: list[Capture]) -> Agreement:
    """Match each capture with the proxy's stamps of the same ``X-Request-Id``."""
    lags: list[float] = []
    seen: list[float] = []
    gaps: list[float] = []
    ttfts: list[float] = []
    ingest: list[float] = []
    mismatched: list[str] = []
    rows: list[str] = []
    for cap in caps:
        mine = cap.output_ns
        theirs = proxy.watcher.output_ns.get(cap.request_id, [])
        record = proxy.sink.requests[cap.request_id]
        if len(mine) != len(theirs):
            mismatched.append(f"{cap.request_id}: client {len(mine)} events, proxy {len(theirs)}")
            continue
        lags += [(c - p) / 1e9 for c, p in zip(mine, theirs, strict=True)]
        if cap.seen_ns:
            seen += [(c - p) / 1e9 for c, p in zip(cap.seen_ns, theirs, strict=True)]
        client_gaps = [b - a for a, b in itertools.pairwise(mine)]
        proxy_gaps = [b - a for a, b in itertools.pairwise(theirs)]
        gaps += [(c - p) / 1e9 for c, p in zip(client_gaps, proxy_gaps, strict=True)]
        # Same gaps reach the sink as gap_s (the histogram's observations).
        assert [round(g / 1e9, 9) for g in proxy_gaps] == [
            round(g, 9) for g in proxy.sink.gaps[cap.request_id]
        ]
        if mine and record.ttft_s is not None:
            ttfts.append(cap.ttft_s - record.ttft_s)
            ingest.append((record.arrival_ns - cap.sent_ns) / 1e9)
            rows.append(
                f"{cap.request_id:>16}: TTFT client {cap.ttft_s * 1e3:9.3f} ms, proxy "
                f"{record.ttft_s * 1e3:9.3f} ms, first token lag {(mine[0] - theirs[0]) / 1e6:6.3f} ms"
            )
    return Agreement(lags, seen, gaps, ttfts, ingest, mismatched, rows)
