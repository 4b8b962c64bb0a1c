"""``tokenstamp advise``: the chunk-size advice of a running proxy, as a table or JSON.

Reads ``GET /advice`` from the proxy's admin listener (``--admin``), passing the
overrides as query parameters. Exit status: 0 every backend advised; 3 not
enough data yet for at least one backend (the output says which observations
are missing); 1 the admin listener could not be read; 2 bad flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from proxy.advisor.report import exit_status, render
from proxy.advisor.web import parse_chunk_sizes

EXIT_OK = 0
"""Every backend was advised."""
EXIT_UNREACHABLE = 1
"""The admin listener could not be read (or did not answer JSON)."""
EXIT_NOT_ENOUGH_DATA = 3
"""At least one backend has not enough data yet."""


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _chunks(text: str) -> str:
    try:
        parse_chunk_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``advise`` subcommand (sets ``func=run``)."""
    parser = subparsers.add_parser(
        "advise",
        epilog="Reference: docs/advisor.md in the tokenstamp source tree.",
        help="what each prefill chunk size would do on a running proxy's backend",
        description="Print the chunk-size advisor's table (worst gap, token rate during a "
        "prefill, new request's first token per chunk size; the recommendation, capacity and "
        "a separate prefill pool), fitted from the proxy's own traffic. Exit status 0: "
        "advised; 3: not enough data yet (says what is missing); 1: admin unreachable.",
    )
    parser.add_argument(
        "--admin", default="http://127.0.0.1:9464", metavar="URL",
        help="the proxy's admin listener (default http://127.0.0.1:9464)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the /advice JSON")
    parser.add_argument(
        "--prompt-tokens", type=_positive_int, metavar="N",
        help="the new prompt's uncached tokens (default: the deployment's p95)",
    )  # fmt: skip
    parser.add_argument(
        "--streams", type=_count, metavar="N",
        help="streams decoding (default: the deployment's typical number)",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-sizes", type=_chunks, metavar="LIST",
        help="candidates, e.g. 512,2048,none (default 256,512,1024,2048,4096,8192,none)",
    )  # fmt: skip
    parser.add_argument(
        "--itl-target", type=_seconds, metavar="S",
        help="worst gap allowed, seconds (default: the proxy's --slo-tpot)",
    )  # fmt: skip
    parser.add_argument(
        "--kv-transfer", type=_seconds, metavar="S",
        help="KV-cache transfer time of a separate prefill pool, seconds (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=_seconds, default=10.0, metavar="S",
        help="seconds to wait for the proxy (default 10)",
    )  # fmt: skip
    parser.set_defaults(func=run)


def advice_url(args: argparse.Namespace) -> str:
    """The ``/advice`` URL with the overrides of ``args`` as query parameters."""
    base = args.admin if "://" in args.admin else "http://" + args.admin
    query = {
        key: str(value)
        for key, value in (
            ("prompt_tokens", args.prompt_tokens),
            ("streams", args.streams),
            ("chunk_sizes", args.chunk_sizes),
            ("itl_target", args.itl_target),
            ("kv_transfer", args.kv_transfer),
        )
        if value is not None
    }
    url = str(base).rstrip("/") + "/advice"
    return url + ("?" + urllib.parse.urlencode(query) if query else "")


def fetch(url: str, timeout_s: float) -> dict[str, Any]:
    """The JSON of ``url``; OSError or ValueError with a message when it cannot be had."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace").strip()
        raise ValueError(f"{url}: HTTP {exc.code}: {detail}") from None
    data = json.loads(body)
    if not isinstance(data, dict) or not isinstance(data.get("backends"), list):
        raise ValueError(f"{url}: not an /advice document")
    return data


def run(args: argparse.Namespace) -> int:
    """Fetch, print, and return the exit status."""
    url = advice_url(args)
    try:
        data = fetch(url, args.timeout)
    except (OSError, ValueError) as exc:
        print(f"tokenstamp advise: cannot read {url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    backends = data["backends"]
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print("\n\n".join(render(b) for b in backends) or "no backends")
    return EXIT_NOT_ENOUGH_DATA if exit_status(backends) else EXIT_OK
