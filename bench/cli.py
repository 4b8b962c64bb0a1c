"""``tokenstamp bench``: direct vs bare pass-through vs tokenstamp, in one run.

Registered into the ``tokenstamp`` command by ``proxy.cli`` through
``register(subparsers)``. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from types import FrameType

from bench.children import ChildError
from bench.plot import PlotUnavailable, plot_path, write_plot
from bench.report import markdown, to_json
from bench.run import BenchError, BenchOptions, run_bench
from bench.targets import (
    BUILTIN_TARGETS,
    DEFAULT_TARGETS,
    TargetError,
    parse_define,
    select_targets,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``bench`` subcommand."""
    known = "; ".join(f"{t.name}: {t.description}" for t in BUILTIN_TARGETS)
    p = subparsers.add_parser(
        "bench",
        help="benchmark: direct vs bare pass-through vs tokenstamp (transit, CPU per token)",
        description="Start a stamping backend and each target as separate processes on free "
        "loopback ports, run the same streaming load against each in rotating rounds, and "
        "report per-token transit and each proxy's CPU time per token (medians over rounds). "
        f"Targets: {known}.",
    )
    p.add_argument("--streams", type=int, default=64, help="concurrent streams (default 64)")
    p.add_argument(
        "--rate",
        type=float,
        default=50.0,
        help="tokens/s per stream sent by the backend (default 50)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="measured seconds per target, split over the rounds (default 10)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds; each runs every target once in rotating order (default 3)",
    )
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per request (default 200)")
    p.add_argument(
        "--warmup",
        type=float,
        default=1.0,
        help="seconds of load before each measured window (default 1)",
    )
    p.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help=f"comma-separated target names (default {','.join(DEFAULT_TARGETS)})",
    )
    p.add_argument(
        "--define",
        action="append",
        default=[],
        metavar="NAME=COMMAND",
        help="add a target: NAME=[VAR=VALUE ...] COMMAND, with placeholders {python} "
        "{upstream} {listen} {port} {admin} {admin_port}; repeatable",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the full report as JSON")
    p.add_argument("--markdown", type=Path, metavar="PATH", help="also write the table as Markdown")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        help="also draw the results as a PNG (default with --markdown or --json: beside that "
        "file, same name, .png); needs matplotlib",
    )
    p.set_defaults(func=run)


def _fail(message: str, status: int) -> int:
    print(f"tokenstamp bench: error: {message}", file=sys.stderr)
    return status


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through ``Children``, which stops every child


def run(args: argparse.Namespace) -> int:
    """Run the benchmark from parsed flags; 0 on success, 2 on bad flags, 1 on failure."""
    try:
        defined = [parse_define(d) for d in args.define]
        targets = select_targets(args.targets, defined)
    except TargetError as exc:
        return _fail(str(exc), 2)
    if args.streams < 1 or args.rounds < 1 or args.max_tokens < 1:
        return _fail("--streams, --rounds and --max-tokens must be >= 1", 2)
    if args.rate <= 0 or args.duration <= 0 or args.warmup < 0:
        return _fail("--rate and --duration must be > 0, --warmup >= 0", 2)
    options = BenchOptions(
        targets=targets,
        streams=args.streams,
        rate_per_s=args.rate,
        duration_s=args.duration,
        rounds=args.rounds,
        max_tokens=args.max_tokens,
        warmup_s=args.warmup,
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = run_bench(options, log=lambda line: print(line, file=sys.stderr, flush=True))
    except (BenchError, ChildError, TargetError) as exc:
        return _fail(str(exc), 1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    table = markdown(report)
    sys.stdout.write(table)
    if args.markdown is not None:
        args.markdown.write_text(table, encoding="utf-8")
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(report), indent=2) + "\n", encoding="utf-8")
    plot = plot_path(args.plot, args.markdown, args.json)
    if plot is not None:
        try:
            write_plot(report, plot)
            print(f"plot: {plot}", file=sys.stderr)
        except PlotUnavailable as exc:
            print(f"tokenstamp bench: no plot: {exc}", file=sys.stderr)
    return 0 if all(r.identical for r in report.rows) else 1
