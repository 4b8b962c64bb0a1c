"""``python -m simulator simulate ...``: the ``simulate`` subcommand without the proxy's CLI."""

from __future__ import annotations

import argparse
import sys

from simulator.cli import register


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process arguments) and run the subcommand."""
    parser = argparse.ArgumentParser(prog="python -m simulator")
    register(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
