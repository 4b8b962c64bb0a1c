"""The first line of a bench run's Markdown: when it ran, what ran, on what.

A figure read months later is only worth what its conditions are known to be: the
version and commit of the checkout the targets ran from (``-dirty`` when tracked files
differ from it), the hot-path build, the interpreter and the libraries whose loops and
parsers carry every byte, the reference proxy's version, the kernel and the CPUs. The
bench writes this line itself so that the benchmark page never carries a hand-copied one.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import proxy
from bench.nginx import find_program

_SOURCE = Path(proxy.__file__).resolve().parents[1]
"""The tree ``proxy`` was imported from: a git checkout, or site-packages."""


def line(now: datetime | None = None) -> str:
    """``Run <UTC>: tokenstamp <version> (<build> build[, commit <sha>]), Python <v>, aiohttp
    <v>, uvloop <v>, nginx <v>; <kernel>, <n> CPU(s) (<model>).`` (a part it cannot read is
    left out, never guessed)."""
    when = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    build = f"{proxy.hot_path_build()} build"
    commit = git_commit(_SOURCE)
    if commit is not None:
        build += f", commit {commit}"
    parts = [f"tokenstamp {proxy.__version__} ({build})", f"Python {platform.python_version()}"]
    parts += [f"{name} {v}" for name in ("aiohttp", "uvloop") if (v := _version(name))]
    nginx = nginx_version()
    if nginx is not None:
        parts.append(f"nginx {nginx}")
    host = f"{platform.system()} {platform.release()}, {os.cpu_count()} CPU(s)"
    model = cpu_model(_read("/proc/cpuinfo"))
    if model is not None:
        host += f" ({model})"
    return f"Run {when}: {', '.join(parts)}; {host}."


def git_commit(tree: Path) -> str | None:
    """The short commit ``tree`` is checked out at, ``-dirty`` when a tracked file differs
    from it; None when ``tree`` is not the top of a git work tree (an installed wheel)."""
    top = _git(tree, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != tree.resolve():
        return None
    sha = _git(tree, "rev-parse", "--short", "HEAD")
    if sha is None:
        return None
    changed = _git(tree, "status", "--porcelain", "--untracked-files=no")
    return f"{sha}-dirty" if changed else sha


def nginx_version() -> str | None:
    """What ``nginx -v`` says its version is (``1.22.1``); None without nginx."""
    program = find_program("nginx")
    if program is None:
        return None
    try:
        done = subprocess.run([program, "-v"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"nginx/(\S+)", (done.stderr + done.stdout).decode(errors="replace"))
    return found.group(1) if found else None


def cpu_model(cpuinfo: str) -> str | None:
    """The first ``model name`` of ``/proc/cpuinfo``'s text, spaces collapsed; None when absent
    (other architectures name it otherwise, and then it is left out)."""
    found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    return " ".join(found.group(1).split()) if found else None


def _git(tree: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, timeout=10,
                              check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode().strip() if done.returncode == 0 else None


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
