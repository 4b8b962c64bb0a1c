"""``tokenstamp demo``: the seed's tables, measured end to end on the embedded simulator.

Starts the simulator (seed profile) and the proxy in front of it on free local
ports, drives load through the proxy, and prints what the proxy measured next
to the seed's figures and the cost model's prediction:
1. Forty streams decoding, one 4,000-token prompt arrives: unchunked, then
   chunked at 512 (the seed's second table). Next to the model it sets what the
   simulated engine itself recorded (its ground truth, on the proxy's clock) and
   how long the processes waited for a CPU meanwhile: model vs engine is the
   simulator keeping to its cost model, engine vs proxy is delivery.
2. One 480-token answer alone (the seed's first table).
3. A reasoning model: six requests that think before they answer (or call a
   tool, or never get to answer); TTFT, time to first answer token, reasoning
   duration and tokens as the proxy measured them beside the engine's record
   (:mod:`demo.reasoning`).
``--json`` prints the results machine-readably; ``--techniques`` runs the
seed's map of optimisations instead (:mod:`demo.techniques`); ``--serve`` keeps a simulator
and proxy running afterwards for Prometheus to scrape (and ``/timeline`` to
watch). Each stutter run is also drawn, as the ``/timeline`` page shows it, into
``--out`` (default ``./tokenstamp-demo/``): a PNG and a self-contained HTML file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from demo.advice import fetch_advice, fit_traffic, render_advice
from demo.pictures import pictures_report, replay_snapshot, write_run_pictures
from demo.reasoning import run_reasoning
from demo.recording import RecordingSink
from demo.report import render, render_reasoning
from demo.scenarios import SingleMeasurement, StutterMeasurement, run_single, run_stutter
from demo.techniques import main as techniques_main
from proxy.config import HostPort, ProxyConfig
from proxy.core.records import Backend, PrefillRecord, StallCause
from proxy.edge.server import RunningProxy, start_proxy
from proxy.timeline.tokenlog import TokenLog
from simulator.cost import (
    CostModel,
    StutterPrediction,
    predict_seed_stutter,
    predict_single,
    prompt_tokens_for_ttft,
)
from simulator.observe import ObservedStutter, observe_stutter
from simulator.profile import load_profile
from simulator.records import records_from_jsonl

SEED_STUTTER = {
    "unchunked": {"worst_gap_s": 0.143, "token_rate_per_s": 0.0, "ttft_s": 0.143},
    "chunked": {"worst_gap_s": 0.043, "token_rate_per_s": 23.0, "ttft_s": 0.346},
}
SEED_SINGLE = {"ttft_s": 0.320, "tpot_s": 0.022, "output_tokens": 480, "e2e_s": 10.9}
STREAMS = 40
LONG_PROMPT = 4000
CHUNK = 512
DEFAULT_OUT = Path("tokenstamp-demo")


@dataclass(slots=True)
class _Stack:
    sim: asyncio.subprocess.Process
    sim_url: str
    proxy: RunningProxy
    sink: RecordingSink
    log: TokenLog

    async def close(self) -> None:
        await self.proxy.close(drain_timeout_s=2.0)
        if self.sim.returncode is None:
            self.sim.terminate()
            try:
                await asyncio.wait_for(self.sim.wait(), 10)
            except TimeoutError:
                self.sim.kill()
                await self.sim.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _start_simulator(chunk_size: int | None) -> tuple[asyncio.subprocess.Process, str]:
    """The simulator in its own process, so the proxy's work cannot delay its steps."""
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simulator", "simulate", "--listen", f"127.0.0.1:{port}",
        "--profile", "seed", "--chunk-size", "none" if chunk_size is None else str(chunk_size),
        "--nice", "-10",
        stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s:
        for _ in range(400):
            if proc.returncode is not None:
                raise RuntimeError(f"the simulator exited with status {proc.returncode}")
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return proc, url
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.025)
    proc.kill()
    await proc.wait()
    raise RuntimeError("the simulator did not start within 10 s")


async def _start(chunk_size: int | None, *, timeline: bool = False) -> _Stack:
    sim, sim_url = await _start_simulator(chunk_size)
    registry = CollectorRegistry()
    sink = RecordingSink(registry)
    log = TokenLog(capacity=4096)
    cfg = ProxyConfig(
        upstream=sim_url,
        listen=HostPort("127.0.0.1", 0),
        admin=HostPort("127.0.0.1", 0),
        backend_name="simulator",
        provider="tokenstamp-sim",
        timeline=timeline,
    )
    proxy = await start_proxy(cfg, registry=registry, sink=sink, watcher=log)
    return _Stack(sim, sim_url, proxy, sink, log)


def _progress(quiet: bool) -> Any:
    tty = sys.stderr.isatty()

    def show(msg: str) -> None:
        if quiet:
            return
        if tty:
            sys.stderr.write("\r\033[K" + msg)
        else:
            sys.stderr.write(msg + "\n")
        sys.stderr.flush()

    return show


def _pictures(
    snapshot: dict[str, Any], label: str, m: StutterMeasurement, out: Path
) -> dict[str, str | None]:
    """Draw the run as ``/timeline`` shows it: ``<out>/timeline-<label>.png`` and ``.html``."""
    name = "unchunked" if label == "unchunked" else f"chunked at {CHUNK}"
    return write_run_pictures(
        snapshot,
        out / f"timeline-{label}",
        title=f"{name}: {STREAMS} streams decoding, one {LONG_PROMPT:,}-token prompt arrives",
        subtitle="measured by the proxy: worst gap in an existing stream "
        f"{m.worst_gap_s * 1000:,.0f} ms, the new request's first token after "
        f"{m.ttft_s * 1000:,.0f} ms",
        zero_id=m.long_request_id,
        x_label=f"seconds since the {LONG_PROMPT:,}-token prompt was forwarded",
    )


async def _stutter(
    label: str, chunk: int | None, show: Any, out: Path | None = None
) -> dict[str, Any]:
    stack = await _start(chunk)
    try:
        m = await run_stutter(
            stack.proxy.url,
            stack.log,
            label=label,
            streams=STREAMS,
            prompt_tokens=LONG_PROMPT,
            backend_pid=stack.sim.pid,
            progress=show,
        )
        rec = stack.sink.records[m.long_request_id]
        m = replace(m, ttft_s=rec.ttft_s if rec.ttft_s is not None else float("nan"))
        engine = await _engine_view(stack.sim_url, m.long_request_id)
        # The run is over: let the stall view settle everything still pending.
        if stack.proxy.stalls is not None:
            stack.proxy.stalls.flush(time.monotonic_ns() + 10_000_000_000)
        detected = _detected(stack.sink, m)
        # Replayed from the run's records rather than kept live, so that drawing
        # adds nothing to the proxy's work while it measures.
        snapshot = replay_snapshot(
            Backend(stack.proxy.config.provider, stack.proxy.config.backend_label),
            stack.log.timelines.values(),
            stalls=stack.sink.stalls,
            prefills=stack.sink.prefills,
            requests=stack.sink.records.values(),
        )
    finally:
        await stack.close()
    pictures = None if out is None else _pictures(snapshot, label, m, out)
    cost = load_profile("seed").with_overrides(chunk_size=chunk).cost
    pred = predict_seed_stutter(cost, STREAMS, LONG_PROMPT)
    return {
        "label": label,
        "chunk_size": chunk,
        "streams": STREAMS,
        "prompt_tokens": LONG_PROMPT,
        "measured": asdict(m),
        "model": _model_view(pred),
        "engine": asdict(engine),
        "seed": SEED_STUTTER[label],
        "detected": detected,
        "pictures": pictures,
    }


async def _engine_view(sim_url: str, long_id: str) -> ObservedStutter:
    """What the simulated engine recorded around the long prompt (its ground truth)."""
    text = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for kind in ("step", "prefill"):
            async with session.get(sim_url + "/sim/ground_truth", params={"type": kind}) as r:
                r.raise_for_status()
                text += await r.text()
    return observe_stutter(records_from_jsonl(text), long_id)


def _detected(sink: RecordingSink, m: StutterMeasurement) -> dict[str, Any]:
    """What the stall view reported: the culprits and the stalls, by cause."""
    culprits = [
        {
            "request_id": p.request_id,
            # The backend's own count from usage, else the proxy's estimate from the body.
            "prompt_tokens": _prompt_tokens(sink, p),
            "stalled_streams": p.stalled_streams,
            "stalls": p.stalls,
            "stutter_cost_s": p.stutter_cost_s,
        }
        for p in sink.prefills
        if p.stalled_streams
    ]
    by_cause = {c.value: 0 for c in StallCause}
    for s in sink.stalls:
        by_cause[s.cause.value] += 1
    durations = sorted(s.duration_s for s in sink.stalls)
    return {
        "culprits": culprits,
        "stalls_by_cause": by_cause,
        "median_stall_s": durations[len(durations) // 2] if durations else None,
        "long_request_blamed": any(c["request_id"] == m.long_request_id for c in culprits),
    }


def _prompt_tokens(sink: RecordingSink, p: PrefillRecord) -> int | None:
    rec = sink.records.get(p.request_id)
    if rec is not None and rec.prompt_tokens is not None:
        return rec.prompt_tokens
    return p.prompt_tokens_hint


def _model_view(p: StutterPrediction) -> dict[str, float]:
    # The long request reaches the engine at some point of a running step and
    # waits for it to end: from nothing to a whole steady step, half on average.
    return {
        "worst_gap_s": p.worst_gap_s,
        "token_rate_per_s": p.token_rate_during_prefill_per_s,
        "ttft_s": p.ttft_s + p.steady_gap_s / 2,
        "ttft_min_s": p.ttft_s,
        "ttft_max_s": p.ttft_s + p.steady_gap_s,
        "prefill_window_s": p.prefill_window_s,
        "steady_gap_s": p.steady_gap_s,
    }


async def _single(show: Any) -> dict[str, Any]:
    cost: CostModel = load_profile("seed").cost
    prompt = prompt_tokens_for_ttft(cost, SEED_SINGLE["ttft_s"])
    out = int(SEED_SINGLE["output_tokens"])
    stack = await _start(None)
    try:
        m = await run_single(
            stack.proxy.url, stack.log, prompt_tokens=prompt, output_tokens=out, progress=show
        )
        rec = stack.sink.records["single-request"]
    finally:
        await stack.close()
    m = SingleMeasurement(
        output_tokens=rec.output_tokens,
        ttft_s=rec.ttft_s or 0.0,
        tpot_s=rec.tpot_s or m.tpot_s,
        e2e_s=rec.duration_s,
    )
    pred = predict_single(cost, prompt, out)
    return {
        "prompt_tokens": prompt,
        "measured": asdict(m),
        "seed": SEED_SINGLE,
        "model": {"ttft_s": pred.ttft_s, "tpot_s": pred.tpot_s, "e2e_s": pred.e2e_s},
    }


async def _advice(show: Any) -> dict[str, Any]:
    """The advisor fitted on a short run of its own (chunked at 512), for the seed's scenario."""
    stack = await _start(CHUNK)
    try:
        show("the advisor: fitting the backend from its own traffic")
        await fit_traffic(stack.proxy.url, step_s=0.023)
        return await fetch_advice(stack.proxy.admin_url, LONG_PROMPT, STREAMS)
    finally:
        await stack.close()


async def _main(args: argparse.Namespace) -> int:
    show = _progress(args.json)
    out: Path | None = None if args.no_pictures else args.out
    if args.techniques:
        return await techniques_main(args.json, out, show)
    results: dict[str, Any] = {}
    results["unchunked"] = await _stutter("unchunked", None, show, out)
    results["chunked"] = await _stutter("chunked", CHUNK, show, out)
    results["single"] = await _single(show)
    results["reasoning"] = await run_reasoning(show, out)
    results["advice"] = await _advice(show)
    show("done")
    if not args.json:
        sys.stderr.write("\n" if sys.stderr.isatty() else "")
        print(render(results))
        print()
        print(render_reasoning(results["reasoning"]))
        print(render_advice(results))
        runs = {k: results[k]["pictures"] for k in ("unchunked", "chunked", "reasoning")}
        if any(runs.values()):
            print("\n" + pictures_report(runs))
    else:
        print(json.dumps(results, indent=2))
    if args.serve:
        await _serve_forever()
    return 0


async def _serve_forever() -> None:
    stack = await _start(None, timeline=True)
    print(f"\nsimulator: {stack.sim_url}  (OpenAI base URL {stack.sim_url}/v1)")
    print(f"proxy:     {stack.proxy.url}  (OpenAI base URL {stack.proxy.url}/v1)")
    print(f"metrics:   {stack.proxy.admin_url}/metrics")
    print(f"timeline:  {stack.proxy.admin_url}/timeline")
    print("Ctrl-C to stop.", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await stack.close()


def run(args: argparse.Namespace) -> int:
    """Entry point of ``tokenstamp demo``."""
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        epilog="Reference: docs/demo.md in the tokenstamp source tree.",
        help="run the seed's prefill-vs-decode scenarios on the built-in simulator",
        description="Start the simulator and the proxy on free local ports, run the seed's "
        "scenarios through the proxy and print what it measured next to the seed's figures.",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help="where the pictures of the two runs go, PNG and HTML (default ./tokenstamp-demo)",
    )
    p.add_argument("--no-pictures", action="store_true", help="draw no pictures")
    p.add_argument(
        "--techniques",
        action="store_true",
        help="instead, run one workload on a baseline and on each of the seed's techniques "
        "(prefix reuse, speculative decoding, KV budget, static batching, disaggregation)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="afterwards keep a simulator and proxy running and print their URLs",
    )
    p.set_defaults(func=run)
