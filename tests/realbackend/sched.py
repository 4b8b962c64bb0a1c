"""How long processes waited for a CPU: is the machine oversubscribed right now?

Latency comparisons between two processes (proxy and client, proxy and
server) hold to a millisecond only while neither waits for a CPU. Linux keeps,
per thread, the time spent runnable but not running (``/proc/PID/task/*/
schedstat``, second field). The tests measure it over a run and relax their
tight bounds, saying so, when it was large (other jobs on the machine).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

QUIET_SHARE = 0.002
"""Below this share of a run spent waiting for a CPU, the machine counts as quiet."""


def run_queue_wait_ns(pid: int | str = "self") -> int:
    """Nanoseconds the threads of ``pid`` have spent runnable but waiting for a CPU."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
    return total


@dataclass
class Contention:
    """Run-queue waits of named processes over one run."""

    duration_s: float = 0.0
    """Length of the run."""
    waits_s: dict[str, float] = field(default_factory=dict)
    """Per process name: time runnable but not running."""

    @property
    def share(self) -> float:
        """The largest wait as a share of the run."""
        return max(self.waits_s.values(), default=0.0) / max(self.duration_s, 1e-9)

    @property
    def quiet(self) -> bool:
        """Whether tight latency bounds are meaningful for this run."""
        return self.share <= QUIET_SHARE

    def line(self) -> str:
        """One line for the test output."""
        waits = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.waits_s.items())
        state = "quiet" if self.quiet else "OVERSUBSCRIBED"
        return (
            f"run {self.duration_s:.2f} s; waited for a CPU: {waits} "
            f"({self.share:.1%} of the run: {state}, quiet below {QUIET_SHARE:.1%})"
        )


class WaitMeter:
    """``with WaitMeter(proxy="self", server=pid) as m: ...``; then ``m.result``."""

    def __init__(self, **pids: int | str) -> None:
        self.pids = pids
        self.result = Contention()
        self._t0 = 0.0
        self._w0: dict[str, int] = {}

    def add(self, name: str, wait_s: float) -> None:
        """Add a wait measured elsewhere (a child that reported its own)."""
        self.result.waits_s[name] = self.result.waits_s.get(name, 0.0) + wait_s

    def __enter__(self) -> WaitMeter:
        self._t0 = time.monotonic()
        self._w0 = {k: run_queue_wait_ns(p) for k, p in self.pids.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.result.duration_s = time.monotonic() - self._t0
        for k, p in self.pids.items():
            self.add(k, (run_queue_wait_ns(p) - self._w0[k]) / 1e9)


MEASURING_RT_PRIORITY = 10
"""SCHED_FIFO priority of the threads that measure (proxy loop, client loop) during a run."""
MEASURING_NICE = -10
"""Their niceness when real-time scheduling is not permitted."""


class Boost:
    """``with Boost():`` the calling thread outranks ordinary work, then runs as before.

    The proxy and its client measure latency in milliseconds; the server and
    any other job on the machine only compute. A measuring thread that waits
    behind them for a CPU adds the wait to its stamps, so for the run it gets
    a real-time priority (``SCHED_FIFO``; both loops mostly sleep, and the
    kernel's real-time throttling bounds them anyway), or a lower niceness if
    that is not permitted, or nothing without privileges (then ``Contention``
    tells the story).
    """

    def __init__(self) -> None:
        self.applied = ""
        self._policy = 0
        self._param: os.sched_param | None = None
        self._nice = 0

    def __enter__(self) -> Boost:
        self._policy = os.sched_getscheduler(0)
        self._param = os.sched_getparam(0)
        self._nice = os.getpriority(os.PRIO_PROCESS, 0)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(MEASURING_RT_PRIORITY))
            self.applied = "fifo"
        except PermissionError:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, MEASURING_NICE)
                self.applied = "nice"
            except PermissionError:
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        if self.applied == "fifo":
            assert self._param is not None
            os.sched_setscheduler(0, self._policy, self._param)
        elif self.applied == "nice":
            os.setpriority(os.PRIO_PROCESS, 0, self._nice)
