"""The ``simulate`` subcommand, and :func:`start_simulator` to run one in-process.

``tokenstamp simulate --listen 127.0.0.1:8000 --profile seed --chunk-size 512``
serves the simulated engine until SIGINT or SIGTERM; ``--reasoning-tokens 64``
makes it a reasoning model (64 reasoning deltas before every chat answer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import EllipsisType

from aiohttp import web

from simulator.engine import Engine, EngineConfig
from simulator.profile import REASONING_FIELDS, Profile, load_profile
from simulator.server import create_app


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _chunk_size(value: str) -> int | None:
    if value.lower() == "none":
        return None
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'none', got {value!r}")
    return int(value)


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def _count(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}")
    return int(value)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``simulate`` subcommand (sets ``func=run``)."""
    parser = subparsers.add_parser(
        "simulate",
        epilog="Reference: docs/demo.md (the simulator) and docs/configuration.md in the "
        "tokenstamp source tree.",
        help="run a simulated OpenAI-compatible inference engine (continuous batching)",
        description="Serve a step-based inference engine model with vLLM-like SSE streaming.",
    )
    parser.add_argument(
        "--listen", type=_listen, default=("127.0.0.1", 8000), metavar="HOST:PORT",
        help="address to serve on (default 127.0.0.1:8000)",
    )  # fmt: skip
    parser.add_argument(
        "--profile", default="seed", metavar="NAME|PATH",
        help="built-in profile (seed, seed-chunked, fast) or a JSON profile file (default seed)",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-size", type=_chunk_size, default=..., metavar="N|none",
        help="prefill tokens per step, or 'none' for unchunked (default: the profile's)",
    )  # fmt: skip
    parser.add_argument(
        "--max-num-seqs", type=_positive, default=None, metavar="N",
        help="most sequences in the batch (default: the profile's)",
    )  # fmt: skip
    parser.add_argument(
        "--output-tokens", type=_positive, default=None, metavar="N",
        help="output length of requests without max_tokens (default: the profile's)",
    )  # fmt: skip
    parser.add_argument(
        "--reasoning-tokens", type=_count, default=None, metavar="N",
        help="a reasoning model: N reasoning deltas before each chat answer, unless the request "
        "says (sim_reasoning_tokens); 0 answers at once (default: the profile's, 0 built in)",
    )  # fmt: skip
    parser.add_argument(
        "--reasoning-field", choices=REASONING_FIELDS, default=None,
        help="the delta field reasoning streams in: reasoning (vLLM since 0.11.1) or "
        "reasoning_content (older vLLM, SGLang, llama.cpp) (default: the profile's, reasoning)",
    )  # fmt: skip
    parser.add_argument(
        "--prefix-cache", action=argparse.BooleanOptionalAction, default=False,
        help="cache prompt blocks of 16 tokens and skip their prefill (default off)",
    )  # fmt: skip
    parser.add_argument(
        "--ground-truth", type=Path, default=None, metavar="PATH",
        help="append every step, token, prefill and finish record to this JSONL file",
    )  # fmt: skip
    parser.add_argument(
        "--nice", type=int, default=0, metavar="N",
        help="change the process's scheduling priority by N (negative: favoured; needs root). "
        "The simulator stands in for an accelerator that shares no CPU with the proxy: "
        "the demo and tests run it at -10 so the machine's load does not stretch its steps",
    )  # fmt: skip
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 on a clean stop, 2 on a bad profile or address."""
    if args.nice:
        try:
            os.nice(args.nice)
        except OSError as exc:
            print(f"tokenstamp simulate: --nice {args.nice} not applied: {exc.strerror}",
                  file=sys.stderr)  # fmt: skip
    try:
        profile = load_profile(args.profile).with_overrides(
            chunk_size=args.chunk_size,
            max_num_seqs=args.max_num_seqs,
            output_tokens=args.output_tokens,
            reasoning_tokens=args.reasoning_tokens,
            reasoning_field=args.reasoning_field,
        )
        config = EngineConfig(
            profile, prefix_cache=args.prefix_cache, ground_truth_path=args.ground_truth
        )
    except ValueError as exc:
        print(f"tokenstamp simulate: {exc}", file=sys.stderr)
        return 2
    host, port = args.listen
    try:
        asyncio.run(_serve(config, host, port))
    except OSError as exc:  # port in use, address not available
        print(
            f"tokenstamp simulate: --listen {host}:{port}: {exc.strerror or exc}", file=sys.stderr
        )
        return 2
    return 0


async def _serve(config: EngineConfig, host: str, port: int) -> None:
    sim = await start_simulator(config, host=host, port=port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    cost = config.profile.cost
    print(
        f"tokenstamp simulate: {sim.url} profile={config.profile.name} "
        f"chunk_size={cost.chunk_size} max_num_seqs={cost.max_num_seqs} "
        f"prefix_cache={config.prefix_cache} "
        f"reasoning_tokens={config.profile.reasoning_tokens} "
        f"techniques={','.join(config.profile.techniques.to_mapping()) or 'none'}",
        file=sys.stderr,
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await sim.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


@dataclass(frozen=True, slots=True)
class RunningSimulator:
    """A simulator serving in this process."""

    url: str
    """Server root, e.g. ``http://127.0.0.1:41234`` (OpenAI base URL: ``url + "/v1"``)."""
    engine: Engine
    """The engine (ground truth, batch state)."""
    runner: web.AppRunner
    """The aiohttp runner serving it."""

    @property
    def base_url(self) -> str:
        """OpenAI SDK base URL (``url + "/v1"``)."""
        return self.url + "/v1"

    async def close(self) -> None:
        """Stop serving and close the engine."""
        await self.runner.cleanup()


async def start_simulator(
    profile: Profile | EngineConfig | str = "seed",
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    chunk_size: int | EllipsisType | None = ...,
    max_num_seqs: int | None = None,
    output_tokens: int | None = None,
    prefix_cache: bool | None = None,
    ground_truth_path: Path | None = None,
    reasoning_tokens: int | None = None,
) -> RunningSimulator:
    """Serve a simulator on ``host:port`` (0: a free port) in the running loop.

    ``profile`` is a Profile, a name or JSON path, or a full EngineConfig; the
    keyword knobs override it (``chunk_size=None``: unchunked; ``...``: keep).
    """
    if isinstance(profile, EngineConfig):
        config = profile
    else:
        config = EngineConfig(load_profile(profile) if isinstance(profile, str) else profile)
    config = EngineConfig(
        config.profile.with_overrides(
            chunk_size=chunk_size,
            max_num_seqs=max_num_seqs,
            output_tokens=output_tokens,
            reasoning_tokens=reasoning_tokens,
        ),
        prefix_cache=config.prefix_cache if prefix_cache is None else prefix_cache,
        prefix_cache_blocks=config.prefix_cache_blocks,
        ground_truth_path=ground_truth_path or config.ground_truth_path,
        ground_truth_limit=config.ground_truth_limit,
    )
    engine = Engine(config)
    runner = web.AppRunner(create_app(engine), handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
    except BaseException:
        with contextlib.suppress(Exception):
            await runner.cleanup()
        raise
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return RunningSimulator(f"http://{shown}:{bound_port}", engine, runner)
