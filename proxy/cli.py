"""The ``tokenstamp`` command: ``serve``, ``simulate``, ``demo``, ``bench``.

User errors (bad flags, bad values, a port in use) exit 2 with one line that
names the key; no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from proxy import __version__, hot_path_build
from proxy.config import ConfigError, add_serve_arguments, build_config

# Subcommands that live in other packages (the simulator, the demo, the bench)
# register themselves under this entry-point group with a ``register(subparsers)``
# function, so the proxy names none of them; an uninstalled one is simply absent.
COMMANDS_GROUP = "tokenstamp.commands"


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _run_serve(args: argparse.Namespace) -> int:
    config = build_config(args, os.environ)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    from proxy.edge.server import serve_forever

    with asyncio.Runner(loop_factory=loop_factory(config.loop)) as runner:
        return runner.run(serve_forever(config))


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``--loop`` asks for: uvloop's, or ``None`` for asyncio's default.

    ``auto`` takes uvloop where it is installed: libuv's loop runs the same
    callbacks with less CPU per read and write (docs/benchmark.md)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":  # validated at start-up; only a broken install gets here
            raise ConfigError("--loop: uvloop cannot be imported") from None
        return None
    return uvloop.new_event_loop


def build_parser() -> argparse.ArgumentParser:
    """The full command-line parser."""
    parser = _Parser(
        prog="tokenstamp",
        description="Streaming reverse proxy that stamps every LLM token: time to first token "
        "(prefill), time per output token and every inter-token gap (decode), and "
        "prefill-induced stutter, as Prometheus metrics.",
        epilog="Start with README.md; the reference is docs/ in the tokenstamp source tree "
        "(docs/configuration.md: every flag, variable and chart value).",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"tokenstamp {__version__} ({hot_path_build()} hot path)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    serve = sub.add_parser(
        "serve",
        help="run the proxy in front of an inference server",
        description="Proxy every request to --upstream unchanged; time completion streams; "
        "serve /metrics, /healthz and /readyz on --admin. Every flag can also be set as "
        "the environment variable shown; a flag wins over the environment.",
        epilog="Reference: docs/configuration.md (every flag, variable and chart value) and "
        "docs/proxying.md (what the proxy changes, and never does) in the tokenstamp source tree.",
    )
    add_serve_arguments(serve)
    serve.set_defaults(func=_run_serve)
    for command in sorted(entry_points(group=COMMANDS_GROUP), key=lambda ep: ep.name):
        command.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc: int = args.func(args)
    except ConfigError as exc:
        print(f"tokenstamp: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
