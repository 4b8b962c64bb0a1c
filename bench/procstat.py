"""CPU time of a process from ``/proc/<pid>/stat`` (Linux, proc(5)).

User plus system time of all the process's threads, in clock ticks
(``SC_CLK_TCK``, usually 100 per second), read as seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_UTIME_FIELD = 14
"""1-based field number of ``utime`` in proc(5); ``stime`` follows it."""


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """CPU time a process has used so far."""

    user_s: float
    """Time in user mode, seconds."""
    system_s: float
    """Time in kernel mode, seconds."""

    @property
    def total_s(self) -> float:
        """User plus system, seconds."""
        return self.user_s + self.system_s


def parse_stat(line: str, ticks_per_s: int) -> CpuTimes:
    """Parse one ``/proc/<pid>/stat`` line.

    The second field (the command name) is in parentheses and may itself hold
    spaces and parentheses, so fields are counted from its last ``)``.
    """
    end = line.rfind(")")
    if end < 0:
        raise ValueError(f"not a /proc/<pid>/stat line: {line[:80]!r}")
    rest = line[end + 1 :].split()
    # ``rest`` starts at field 3 (state); utime is field 14.
    first = _UTIME_FIELD - 3
    if len(rest) < first + 2:
        raise ValueError(f"/proc/<pid>/stat line too short: {line[:80]!r}")
    return CpuTimes(
        user_s=int(rest[first]) / ticks_per_s,
        system_s=int(rest[first + 1]) / ticks_per_s,
    )


def clock_ticks() -> int:
    """Clock ticks per second of the stat counters."""
    return int(os.sysconf("SC_CLK_TCK"))


def read_cpu(pid: int, ticks_per_s: int | None = None) -> CpuTimes:
    """CPU times of a running process; ``OSError`` when it does not exist."""
    with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
        line = f.read()
    return parse_stat(line, ticks_per_s or clock_ticks())
