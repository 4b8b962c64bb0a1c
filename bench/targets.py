"""Benchmark targets: named command lines (plus environment) that run a proxy to measure.

A target is started as its own process on free loopback ports; the load runs
against its ``listen`` address and its CPU time is read from the process the
command starts (so the command must exec the server itself, not a shell that
forks it). ``direct`` is the backend itself: no process, no CPU column.

Placeholders in a command: ``{python}`` (this interpreter), ``{upstream}`` (the
backend's base URL), ``{listen}`` and ``{admin}`` (``127.0.0.1:PORT``),
``{port}`` and ``{admin_port}`` (just the numbers), ``{workdir}`` (an empty
folder of the target's own, removed when the run ends).

A target may need a program (``requires``): when it is not on the machine the
target is skipped with a note in the report, not an error (nginx).

More targets are added by name here (e.g. tokenstamp with stall detection or
tracing on or off: the same command with other flags or environment), or at
run time with ``--define 'NAME=[VAR=VALUE ...] COMMAND ...'``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.nginx import find_program

DIRECT = "direct"
"""Name of the target that is the backend itself."""
PASSTHROUGH = "passthrough"
"""Name of the bare pass-through target, the CPU baseline."""
NGINX = "nginx"
"""Name of the nginx target (skipped when nginx is not installed)."""

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class TargetError(ValueError):
    """A target name or definition is invalid; the message says which and why."""


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """One thing to benchmark."""

    name: str
    """Short name used in ``--targets`` and in the table."""
    argv: tuple[str, ...]
    """Command line with placeholders; empty for ``direct``."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables added to the inherited environment."""
    description: str = ""
    """One line for ``--help`` and the report."""
    requires: str = ""
    """A program the target needs (looked up on PATH and in the sbin folders); empty: none."""

    @property
    def is_direct(self) -> bool:
        """No process: the load goes straight to the backend."""
        return not self.argv

    def missing(self) -> str:
        """Why the target cannot run on this machine; empty when it can."""
        if self.requires and find_program(self.requires) is None:
            return f"{self.requires} not found on PATH or in /usr/sbin"
        return ""

    def command(self, values: Mapping[str, str]) -> list[str]:
        """The command line with every placeholder filled in."""
        try:
            return [arg.format_map(values) for arg in self.argv]
        except (KeyError, IndexError, ValueError) as exc:
            raise TargetError(f"target {self.name}: bad placeholder in command: {exc}") from None


_SERVE = (
    "{python}", "-m", "proxy.cli", "serve", "--upstream", "{upstream}", "--listen", "{listen}",
    "--admin", "{admin}", "--log-level", "warning",
)  # fmt: skip
_PASS = ("{python}", "-m", "bench.passthrough", "--upstream", "{upstream}", "--listen", "{listen}")
_TCP = ("{python}", "-m", "bench.tcprelay", "--upstream", "{upstream}", "--listen", "{listen}",
        "--loop", "uvloop")  # fmt: skip
_NGINX = ("{python}", "-m", "bench.nginx", "--upstream", "{upstream}", "--listen", "{listen}",
          "--dir", "{workdir}")  # fmt: skip

BUILTIN_TARGETS: tuple[TargetSpec, ...] = (
    TargetSpec(DIRECT, (), description="the backend itself, no proxy"),
    TargetSpec(NGINX, _NGINX, requires="nginx",
               description="nginx, one process, proxy_buffering off, keep-alive upstream"),
    TargetSpec(PASSTHROUGH, _PASS,
               description="bare aiohttp pass-through (readany/write, no observation)"),
    TargetSpec("passthrough-uvloop", (*_PASS, "--loop", "uvloop"),
               description="the same pass-through on uvloop"),
    TargetSpec("tcp-relay", _TCP,
               description="the floor of a Python proxy: a raw TCP relay on uvloop, one "
               "callback and one write per read, no HTTP, no observation"),
    TargetSpec("tokenstamp", _SERVE, description="tokenstamp serve with its defaults"),
    TargetSpec("tokenstamp-asyncio", (*_SERVE, "--loop", "asyncio"),
               description="tokenstamp serve on the default asyncio loop"),
    TargetSpec("tokenstamp-uvloop", (*_SERVE, "--loop", "uvloop"),
               description="tokenstamp serve on uvloop"),
    TargetSpec("tokenstamp-nostall", (*_SERVE, "--stall-detection", "false"),
               description="tokenstamp serve without stall detection"),
    TargetSpec("tokenstamp-edge", (*_SERVE, "--loop", "uvloop", "--observe", "false"),
               description="tokenstamp serve on uvloop with --observe false: its HTTP edge "
               "alone, every request forwarded untouched, nothing timed"),
)  # fmt: skip
"""Targets known by name; a new variant is one more entry."""

DEFAULT_TARGETS = (
    DIRECT, NGINX, PASSTHROUGH, "passthrough-uvloop", "tokenstamp-asyncio", "tokenstamp-uvloop",
    "tokenstamp-nostall",
)  # fmt: skip
"""What ``tokenstamp bench`` runs without ``--targets`` (nginx skipped when absent)."""


def parse_define(text: str) -> TargetSpec:
    """``NAME=[VAR=VALUE ...] COMMAND ARGS...`` (shell quoting) into a target."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not _NAME_RE.match(name):
        raise TargetError(f"--define: expected NAME=COMMAND with a short name, got {text!r}")
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise TargetError(f"--define {name}: {exc}") from None
    env: list[tuple[str, str]] = []
    while words and _ENV_RE.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env.append((key, value))
    if not words:
        raise TargetError(f"--define {name}: no command given")
    if name == DIRECT:
        raise TargetError(f"--define: {DIRECT!r} is reserved for the backend itself")
    return TargetSpec(name, tuple(words), tuple(env), description="defined on the command line")


def select_targets(names: str, defined: Sequence[TargetSpec] = ()) -> tuple[TargetSpec, ...]:
    """The targets named in a comma-separated list, in that order; definitions win over builtins."""
    known = {t.name: t for t in BUILTIN_TARGETS}
    known.update({t.name: t for t in defined})
    chosen: list[TargetSpec] = []
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        if name not in known:
            raise TargetError(f"--targets: unknown target {name!r} (known: {', '.join(known)})")
        if any(t.name == name for t in chosen):
            raise TargetError(f"--targets: {name!r} named twice")
        chosen.append(known[name])
    if not chosen:
        raise TargetError("--targets: name at least one target")
    return tuple(chosen)
