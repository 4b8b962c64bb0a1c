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
from bench.environment import line as environment_line
from bench.plot import PlotUnavailable, plot_path, write_plot
from bench.report import markdown, to_json
from bench.run import (
    LOCKSTEP,
    MAX_RATE,
    SCENARIOS,
    STEADY,
    BenchError,
    BenchOptions,
    BenchReport,
    run_bench,
)
from bench.targets import (
    BUILTIN_TARGETS,
    DEFAULT_TARGETS,
    TargetError,
    TargetSpec,
    parse_define,
    select_targets,
)
from bench.twopoint import markdown as two_point
from bench.twopoint import shortest_max_rate


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``bench`` subcommand."""
    known = "; ".join(f"{t.name}: {t.description}" for t in BUILTIN_TARGETS)
    p = subparsers.add_parser(
        "bench",
        epilog="Reference: docs/benchmark.md (how to run and read it) in the tokenstamp "
        "source tree.",
        help="benchmark: direct vs bare pass-through vs tokenstamp (transit, CPU per token)",
        description="Start a stamping backend and each target as separate processes on free "
        "loopback ports, run the same streaming load against each in rotating rounds, and "
        "report per-token transit and each proxy's CPU time per token (medians over rounds). "
        f"Targets: {known}.",
    )
    p.add_argument(
        "--scenario",
        default="steady",
        help="comma-separated scenarios, run in turn: steady (each stream on its own timer), "
        "lockstep (every open stream's token written in one backend step), max-rate (requests/s "
        "and tokens/s through one core, one token per read; endless streams without "
        "--max-tokens), or all (default steady)",
    )
    p.add_argument(
        "--streams",
        type=int,
        default=None,
        help="concurrent streams (default: steady 64, lockstep 256, max-rate 128)",
    )
    p.add_argument(
        "--step-rate",
        type=float,
        default=25.0,
        help="lockstep: backend steps per second (default 25)",
    )
    p.add_argument(
        "--memory-streams",
        type=int,
        default=1000,
        help="open streams for the RSS-per-stream figure in steady and lockstep; 0: off "
        "(default 1000)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a short run: 1 round of 3 s per target, 0.5 s warm-up, 200 open streams for memory",
    )
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
    p.add_argument("--max-tokens", type=_lengths, default=None,
                   help="tokens per request, or a comma-separated list (e.g. 10,200): each "
                   "scenario runs at each length, and a table fits what a request costs beside "
                   "its tokens (default: 200; max-rate: endless streams)")  # fmt: skip
    p.add_argument(
        "--tokens-per-write",
        type=int,
        default=1,
        help="steady: content chunks each stream's backend writes at once, so every read of a "
        "target carries that many (default 1)",
    )
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


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through ``Children``, which stops every child


def run(args: argparse.Namespace) -> int:
    """Run the benchmark from parsed flags; 0 on success, 2 on bad flags, 1 on failure."""
    try:
        defined = [parse_define(d) for d in args.define]
        targets = select_targets(args.targets, defined)
    except TargetError as exc:
        return _fail(str(exc), 2)
    scenarios = parse_scenarios(args.scenario)
    if scenarios is None:
        return _fail(f"--scenario: expected a list of {', '.join(SCENARIOS)} or all, "
                     f"got {args.scenario!r}", 2)  # fmt: skip
    if args.quick:
        args.duration, args.rounds, args.warmup = 3.0, 1, 0.5
        args.memory_streams = min(args.memory_streams, 200)
    if (args.streams is not None and args.streams < 1) or args.rounds < 1:
        return _fail("--streams and --rounds must be >= 1", 2)
    if args.rate <= 0 or args.duration <= 0 or args.warmup < 0 or args.step_rate <= 0:
        return _fail("--rate, --step-rate and --duration must be > 0, --warmup >= 0", 2)
    if args.memory_streams < 0:
        return _fail("--memory-streams must be >= 0", 2)
    if args.tokens_per_write < 1:
        return _fail("--tokens-per-write must be >= 1", 2)
    environment = environment_line()  # the commit and time the run starts from
    runs: list[list[BenchReport]] = []
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for scenario in scenarios:
            runs.append(
                [_one(args, targets, scenario, n) for n in _scenario_lengths(args, scenario)]
            )
    except (BenchError, ChildError, TargetError) as exc:
        return _fail(str(exc), 1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    reports = [r for by_length in runs for r in by_length]
    rate = shortest_max_rate(reports)
    tables: list[str] = []
    for by_length in runs:
        tables.extend(markdown(r) for r in by_length)
        fitted = two_point(by_length, rate)
        if fitted:
            tables.append(fitted)
    table = environment + "\n\n" + "\n".join(tables)
    sys.stdout.write(table)
    if args.markdown is not None:
        args.markdown.write_text(table, encoding="utf-8")
    if args.json is not None:
        data = to_json(reports[0]) if len(reports) == 1 else {
            "scenarios": [to_json(r) for r in reports]
        }  # fmt: skip
        args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    plot = plot_path(args.plot, args.markdown, args.json)
    if plot is not None:
        try:
            write_plot(reports[0], plot)
            print(f"plot: {plot}", file=sys.stderr)
        except PlotUnavailable as exc:
            print(f"tokenstamp bench: no plot: {exc}", file=sys.stderr)
    return 0 if all(r.identical for rep in reports for r in rep.rows) else 1


def _one(
    args: argparse.Namespace, targets: tuple[TargetSpec, ...], scenario: str, max_tokens: int
) -> BenchReport:
    """One scenario at one request length."""
    options = BenchOptions(
        targets=targets,
        streams=args.streams or _DEFAULT_STREAMS.get(scenario, 64),
        rate_per_s=args.rate,
        duration_s=args.duration,
        rounds=args.rounds,
        max_tokens=max_tokens,
        warmup_s=args.warmup,
        scenario=scenario,
        step_rate_per_s=args.step_rate,
        memory_streams=0 if scenario == MAX_RATE else args.memory_streams,
        tokens_per_write=args.tokens_per_write if scenario == STEADY else 1,
    )
    return run_bench(options, log=_log)


def _scenario_lengths(args: argparse.Namespace, scenario: str) -> tuple[int, ...]:
    """The request lengths a scenario runs at: ``--max-tokens``; without it 200, and for
    max-rate 0 (endless streams: the per-token ceiling)."""
    if args.max_tokens is not None:
        return tuple(args.max_tokens)
    return (0,) if scenario == MAX_RATE else (200,)


def _lengths(text: str) -> tuple[int, ...]:
    """``200`` or ``10,200``: distinct request lengths of at least one token, in order."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list like 10,200: {text!r}") from None
    if not values or min(values) < 1 or len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"lengths must be distinct and >= 1: {text!r}")
    return values


_DEFAULT_STREAMS = {LOCKSTEP: 256, MAX_RATE: 128}
"""Streams per scenario when ``--streams`` is not given (steady: 64)."""


def parse_scenarios(text: str) -> tuple[str, ...] | None:
    """``steady,lockstep`` or ``all`` into scenario names in order; None when one is unknown."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return SCENARIOS
    if not names or any(n not in SCENARIOS for n in names) or len(set(names)) < len(names):
        return None
    return tuple(names)
