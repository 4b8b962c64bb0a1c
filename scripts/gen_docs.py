"""Write the generated parts of ``docs/``: the metric tables and the configuration reference.

Two pages hold tables made from the code, between ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->`` markers (the prose around them is written by hand):

- ``docs/metrics.md``: every instrument of ``exporters/names.py`` (Prometheus and
  OpenTelemetry names, kind, unit, labels, buckets, meaning);
- ``docs/configuration.md``: every ``tokenstamp serve`` flag with its environment
  variable and default (``proxy/config.py``), every flag of the other subcommands
  (their argument parsers), and every Helm chart value with its default and its
  comment (``helm/tokenstamp/values.yaml``).

A test regenerates both and fails when a page differs, so the pages cannot drift
from the code.

Usage::

    python scripts/gen_docs.py           # rewrite the generated blocks
    python scripts/gen_docs.py --check   # change nothing; exit 1 when a block is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = REPO_ROOT / "docs"
VALUES = REPO_ROOT / "helm" / "tokenstamp" / "values.yaml"

_BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)",
    re.DOTALL,
)


def _cell(text: object) -> str:
    """``text`` fit for one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _number(value: float) -> str:
    return f"{value:g}"


def metrics_table() -> str:
    """One row per instrument of ``exporters.names``, in its order."""
    from exporters import names

    rows = [
        "| Prometheus series | OpenTelemetry instrument | kind | unit | labels | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for inst in names.ALL:
        if inst.kind is names.Kind.HISTOGRAM:
            series = f"`{inst.prom_name}_bucket`, `_sum`, `_count`"
        else:
            series = f"`{inst.prom_series}`"
        labels = ", ".join(f"`{label}`" for label in inst.prom_labels)
        rows.append(
            f"| {series} | `{inst.name}` | {inst.kind.value} | `{inst.unit}` | {labels} | "
            f"{_cell(inst.description)} |"
        )
    return "\n".join(rows) + "\n"


def buckets_table() -> str:
    """The bucket boundaries of every histogram."""
    from exporters import names

    rows = ["| histogram | bucket upper bounds |", "|---|---|"]
    for inst in names.ALL:
        if inst.kind is names.Kind.HISTOGRAM:
            bounds = " ".join(_number(b) for b in inst.buckets)
            rows.append(f"| `{inst.prom_name}` | {bounds} |")
    return "\n".join(rows) + "\n"


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "(none)"
    if value == "" or value is None:
        return "(none)"
    if isinstance(value, float):
        return _number(value)
    return str(value)


def serve_table() -> str:
    """Every ``tokenstamp serve`` flag: its variable, default and meaning."""
    from proxy.config import ENV_PREFIX, SERVE_OPTIONS, ProxyConfig

    defaults = {f.name: f.default for f in dataclasses.fields(ProxyConfig)}
    rows = ["| flag | environment variable | default | meaning |", "|---|---|---|---|"]
    for opt in SERVE_OPTIONS:
        flag = f"`--{opt.flag}`"
        default = defaults.get(opt.field, dataclasses.MISSING)
        if isinstance(default, bool):
            flag += f", `--no-{opt.flag}`"
        if default is dataclasses.MISSING:
            shown = "(required)"
        elif opt.field in ("listen", "admin"):
            shown = f"`{default}`"
        else:
            text = _default_text(default)
            shown = text if text == "(none)" else f"`{text}`"
        env = ENV_PREFIX + opt.flag.upper().replace("-", "_")
        rows.append(f"| {flag} | `{env}` | {shown} | {_cell(opt.help)} |")
    return "\n".join(rows) + "\n"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from proxy.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise RuntimeError("tokenstamp has no subcommands")


def command_table(name: str) -> str:
    """Every flag of the subcommand ``name`` (its own argument parser)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for action in _subparsers()[name]._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flags = ", ".join(f"`{o}`" for o in action.option_strings)
        if action.default in (None, argparse.SUPPRESS) or isinstance(
            action, argparse._StoreTrueAction
        ):
            default = "(none)" if not isinstance(action, argparse._StoreTrueAction) else "off"
        else:
            text = _default_text(action.default)
            default = text if text == "(none)" else f"`{text}`"
        text = (action.help or "").replace("%(default)s", _default_text(action.default))
        rows.append(f"| {flags} | {default} | {_cell(text)} |")
    return "\n".join(rows) + "\n"


def chart_values() -> Iterator[tuple[str, Any, str]]:
    """Every key of ``values.yaml`` that has a ``# --`` comment: dotted path, default, comment."""
    defaults = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    path: list[tuple[int, str]] = []
    comment: list[str] = []
    in_comment = False
    key_line = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+):(?: |$)")
    for line in VALUES.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment, in_comment = [stripped[4:].strip()], True
            continue
        if stripped.startswith("#") and in_comment:
            comment.append(stripped[1:].strip())
            continue
        m = key_line.match(line)
        if not m:
            in_comment = False
            continue
        indent = len(m["indent"])
        while path and path[-1][0] >= indent:
            path.pop()
        path.append((indent, m["key"]))
        if in_comment:
            dotted = ".".join(k for _, k in path)
            value: Any = defaults
            for _, k in path:
                value = value[k] if isinstance(value, dict) else None
            yield dotted, value, " ".join(comment)
        comment, in_comment = [], False


def _value_text(value: Any) -> str:
    if isinstance(value, dict) and value:
        return "(the keys below)"
    if isinstance(value, dict | list):
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
        return f"`{text}`"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{'true' if value else 'false'}`"
    return f'`"{value}"`' if isinstance(value, str) else f"`{value}`"


def chart_table() -> str:
    """Every chart value with its default and meaning."""
    rows = ["| value | default | meaning |", "|---|---|---|"]
    for dotted, value, text in chart_values():
        rows.append(f"| `{dotted}` | {_value_text(value)} | {_cell(text)} |")
    return "\n".join(rows) + "\n"


BLOCKS: dict[str, Callable[[], str]] = {
    "metrics": metrics_table,
    "buckets": buckets_table,
    "serve": serve_table,
    "simulate": lambda: command_table("simulate"),
    "demo": lambda: command_table("demo"),
    "bench": lambda: command_table("bench"),
    "advise": lambda: command_table("advise"),
    "chart": chart_table,
}
"""What each marker's block is made from."""


def render(text: str) -> str:
    """``text`` with every generated block made anew (an unknown name is an error)."""

    def fill(m: re.Match[str]) -> str:
        make = BLOCKS.get(m["name"])
        if make is None:
            raise KeyError(f"no generator for the block {m['name']!r}")
        return m.group(1) + make() + m.group(4)

    return _BLOCK.sub(fill, text)


def pages() -> list[Path]:
    """The docs pages that hold generated blocks."""
    return sorted(p for p in DOCS.glob("*.md") if _BLOCK.search(p.read_text(encoding="utf-8")))


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated blocks, or (``--check``) report stale ones."""
    parser = argparse.ArgumentParser(prog="python scripts/gen_docs.py", description=__doc__)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            stale.append(page.relative_to(REPO_ROOT))
            if not args.check:
                page.write_text(new, encoding="utf-8")
    if args.check and stale:
        print("stale generated docs (run: python scripts/gen_docs.py):", *stale, file=sys.stderr)
        return 1
    for page in stale:
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    raise SystemExit(main())
