"""The simulator side of the techniques demo: a simulator per run, and its ground truth.

:func:`start_simulator` runs ``tokenstamp simulate`` in a process of its own
(favoured with ``--nice -10``, like the seed demo's, so the load on the machine
does not stretch its steps) from a profile file that states the run's
techniques. :func:`engine_view` reduces the run's ground truth (``GET
/sim/ground_truth``) to the figures the proxy's row is checked against; times
are the engine's ``time.monotonic_ns()``, the proxy's clock too.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from simulator.profile import Profile, profile_to_mapping
from simulator.records import PrefillRecord, StepRecord, records_from_jsonl


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Simulator:
    """A simulator serving in a child process."""

    process: asyncio.subprocess.Process
    """The child process."""
    url: str
    """Its server root, e.g. ``http://127.0.0.1:41234``."""

    async def close(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after 10 s)."""
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def write_profile(profile: Profile, path: Path) -> Path:
    """``profile`` as a JSON profile file at ``path`` (what ``--profile PATH`` reads)."""
    path.write_text(json.dumps(profile_to_mapping(profile)), encoding="utf-8")
    return path


async def start_simulator(path: Path, prefix_cache: bool) -> Simulator:
    """Serve the profile file at ``path``; returns once ``/health`` answers."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simulator", "simulate", "--listen", f"127.0.0.1:{port}",
        "--profile", str(path), "--nice", "-10",
        *(["--prefix-cache"] if prefix_cache else []),
        stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    sim = Simulator(proc, f"http://127.0.0.1:{port}")
    async with aiohttp.ClientSession() as session:
        for _ in range(400):
            if proc.returncode is not None:
                raise RuntimeError(f"the simulator exited with status {proc.returncode}")
            try:
                async with session.get(sim.url + "/health") as r:
                    if r.status == 200:
                        return sim
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.025)
    await sim.close()
    raise RuntimeError("the simulator did not start within 10 s")


async def engine_view(
    url: str, long_ids: Sequence[str], steady_start_ns: int, first_long_ns: int, end_ns: int
) -> dict[str, float | int]:
    """What the engine did in the run: its own figures for the row's claims.

    ``ttft_*``: arrival at the engine to first token of the long prompts;
    ``decode_step_s``: median modelled duration of decode steps without prefill;
    ``worst_step_s``: longest step that decoded streams while the prompts were
    served (an unstalled stream's worst gap at the engine); ``prefill_in_decode_steps``:
    such steps that also carried prefill; ``tokens_per_s``: decode tokens per
    second in the steady interval; ``tokens_per_step``: decode tokens per sequence
    per step.
    """
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        text = ""
        for kind in ("step", "prefill"):
            async with session.get(url + "/sim/ground_truth", params={"type": kind}) as r:
                r.raise_for_status()
                text += await r.text()
    records = records_from_jsonl(text)
    steps = [r for r in records if isinstance(r, StepRecord)]
    decode = [s for s in steps if s.decode_batch and s.pool != "prefill"]
    during = [s for s in decode if s.end_ns > first_long_ns and s.start_ns < end_ns]
    wanted = set(long_ids)
    prefills = [r for r in records if isinstance(r, PrefillRecord) and r.x_request_id in wanted]
    ttfts = [(p.end_ns - p.arrival_ns) / 1e9 for p in prefills]
    # Tokens of the steps that ended in the steady interval, but the first, over the time
    # from the first's end to the last's: whole steps, no cut at the edges.
    steady_steps = sorted(
        (s for s in decode if steady_start_ns <= s.end_ns <= first_long_ns), key=lambda s: s.end_ns
    )
    steady_tokens = sum(s.decode_batch + s.accepted_tokens for s in steady_steps[1:])
    steady_s = (steady_steps[-1].end_ns - steady_steps[0].end_ns) / 1e9 if steady_steps else 0.0
    decoded = sum(s.decode_batch for s in decode)
    return {
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "prefill_s": percentile(
            [(p.end_ns - p.start_ns) / 1e9 - p.transfer_s for p in prefills], 50
        ),
        "transfer_s": percentile([p.transfer_s for p in prefills], 50),
        "cached_tokens": percentile([p.cached_tokens for p in prefills], 50),
        "decode_step_s": percentile([s.duration_s for s in decode if not s.prefill_tokens], 50),
        "worst_step_s": max((s.duration_s for s in during), default=math.nan),
        "prefill_in_decode_steps": sum(1 for s in during if s.prefill_tokens),
        "max_decode_batch": max((s.decode_batch for s in decode), default=0),
        "max_waiting": max((s.waiting for s in steps), default=0),
        "tokens_per_s": steady_tokens / steady_s if steady_s else math.nan,
        "tokens_per_step": (decoded + sum(s.accepted_tokens for s in decode)) / decoded
        if decoded
        else math.nan,
    }
