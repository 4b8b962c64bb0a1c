"""Copy the Prometheus rules and Grafana dashboards of ``dashboards/`` into the Helm chart.

``dashboards/`` is the source; the chart ships byte-identical copies:

- every Grafana dashboard, a ``*.json`` file under ``dashboards/`` holding a JSON
  object with a ``panels`` list, goes to ``helm/tokenstamp/files/dashboards/``;
- every Prometheus rule file, a ``*.yaml``/``*.yml`` file under ``dashboards/``
  with a top-level ``groups:`` key, goes to ``helm/tokenstamp/files/rules/``
  (renamed to ``.yaml``). ``promtool test rules`` files (``rule_files:``,
  ``tests:``) are not rule files and stay behind.

Subdirectories are searched too, except hidden ones and ``node_modules``. Copies
keep their file name, so two sources with one name are an error. Copies whose
source is gone are deleted. With no source files yet, the chart's directories
end up empty and its switches render nothing.

Usage::

    python scripts/sync_chart.py           # copy
    python scripts/sync_chart.py --check   # change nothing; exit 1 when stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where the rules and dashboards are written (by the dashboards/ generator).
DEFAULT_SOURCE = REPO_ROOT / "dashboards"
#: The chart that ships copies of them.
DEFAULT_CHART = REPO_ROOT / "helm" / "tokenstamp"
#: Directories never searched: npm's install tree and anything hidden.
SKIPPED_DIRS = frozenset({"node_modules", "__pycache__"})
#: A rule file's top-level key, at the start of a line.
RULE_FILE_KEY = re.compile(r"^groups\s*:", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Copy:
    """One file the chart must hold."""

    source: Path
    """File under the source directory."""
    target: Path
    """Where the chart holds its copy."""


def _searched_files(source: Path) -> list[Path]:
    """Every file under ``source``, sorted, outside hidden and skipped directories."""
    found: list[Path] = []
    for path in sorted(source.rglob("*")):
        parts = path.relative_to(source).parts
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts[:-1]):
            continue
        if path.is_file() and not parts[-1].startswith("."):
            found.append(path)
    return found


def is_dashboard(path: Path) -> bool:
    """True for a JSON file holding a Grafana dashboard (an object with ``panels``)."""
    if path.suffix != ".json":
        return False
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(document, dict) and isinstance(document.get("panels"), list)


def is_rule_file(path: Path) -> bool:
    """True for a Prometheus rule file: YAML with a top-level ``groups:`` key."""
    if path.suffix not in {".yaml", ".yml"}:
        return False
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return False
    return RULE_FILE_KEY.search(text) is not None


def planned_copies(source: Path, chart: Path) -> list[Copy]:
    """The copies the chart must hold, given what ``source`` contains now.

    Raises ``ValueError`` when two sources would land on one target name.
    """
    copies: list[Copy] = []
    if source.is_dir():
        for path in _searched_files(source):
            if is_dashboard(path):
                copies.append(Copy(path, chart / "files" / "dashboards" / path.name))
            elif is_rule_file(path):
                copies.append(Copy(path, chart / "files" / "rules" / f"{path.stem}.yaml"))
    by_target: dict[Path, Path] = {}
    for copy in copies:
        if copy.target in by_target:
            raise ValueError(
                f"{copy.source} and {by_target[copy.target]} would both be copied to "
                f"{copy.target}: rename one"
            )
        by_target[copy.target] = copy.source
    return copies


def _held_copies(chart: Path) -> list[Path]:
    """Files the chart holds now in its rules and dashboards directories."""
    held = sorted((chart / "files" / "dashboards").glob("*.json"))
    held += sorted((chart / "files" / "rules").glob("*.yaml"))
    return held


def differences(source: Path, chart: Path) -> list[str]:
    """What is out of date in the chart, one line each; empty when in sync."""
    copies = planned_copies(source, chart)
    problems: list[str] = []
    for copy in copies:
        if not copy.target.is_file():
            problems.append(f"missing: {copy.target} (from {copy.source})")
        elif copy.target.read_bytes() != copy.source.read_bytes():
            problems.append(f"differs: {copy.target} from {copy.source}")
    wanted = {copy.target for copy in copies}
    problems += [f"stale: {path} (no source)" for path in _held_copies(chart) if path not in wanted]
    return problems


def sync(source: Path, chart: Path) -> list[str]:
    """Make the chart's copies equal the sources; returns what changed, one line each."""
    copies = planned_copies(source, chart)
    changed: list[str] = []
    for copy in copies:
        data = copy.source.read_bytes()
        if copy.target.is_file() and copy.target.read_bytes() == data:
            continue
        copy.target.parent.mkdir(parents=True, exist_ok=True)
        copy.target.write_bytes(data)
        changed.append(f"copied: {copy.source} -> {copy.target}")
    wanted = {copy.target for copy in copies}
    for path in _held_copies(chart):
        if path not in wanted:
            path.unlink()
            changed.append(f"deleted: {path} (no source)")
    return changed


def main(argv: list[str] | None = None) -> int:
    """Command line: copy, or with ``--check`` report differences and exit 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when stale")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="dashboards directory")
    parser.add_argument("--chart", type=Path, default=DEFAULT_CHART, help="chart directory")
    args = parser.parse_args(argv)
    source: Path = args.source
    chart: Path = args.chart
    try:
        if args.check:
            problems = differences(source, chart)
            for line in problems:
                print(line, file=sys.stderr)
            if problems:
                print("run: python scripts/sync_chart.py", file=sys.stderr)
                return 1
            return 0
        for line in sync(source, chart):
            print(line)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
