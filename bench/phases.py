"""The benchmark's figures beyond the rounds: memory per open stream, and max rate on one core.

Each runs a helper process (``bench.memload``, ``bench.maxrate``) against
targets the runner started, and returns plain results the runner aggregates.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.memload import MemoryResult
from bench.result import LoadResult
from bench.stats import EMPTY

TARGET_CORE = 0
"""The core a max-rate target is pinned to."""
LOAD_CORE = 1
"""The core the max-rate load (backend and client in one process) is pinned to."""


class PhaseError(RuntimeError):
    """A helper process failed; the message holds the end of its stderr."""


def _python() -> str:
    return sys.executable or "python3"


def _run_json(argv: Sequence[str], timeout_s: float, what: str) -> dict[str, Any]:
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise PhaseError(f"{what} did not finish within {timeout_s:g} s") from None
    if done.returncode != 0:
        tail = done.stderr[-2000:].decode(errors="replace")
        raise PhaseError(f"{what} failed (status {done.returncode}):\n{tail}")
    try:
        data = json.loads(done.stdout)
    except ValueError as exc:
        raise PhaseError(f"{what} printed no result: {exc}") from None
    if not isinstance(data, dict):
        raise PhaseError(f"{what} printed no JSON object")
    return data


def raise_open_files_limit() -> int:
    """Lift this process's (and so its children's) open-file soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        new = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        return int(new)
    return int(soft)


def measure_memory(url: str, pid: int, streams: int, timeout_s: float = 90.0) -> MemoryResult:
    """RSS of ``pid`` with ``streams`` slowly streaming streams open through ``url``, and before."""
    argv = [_python(), "-m", "bench.memload", "--url", url, "--streams", str(streams),
            "--rss-pid", f"target={pid}", "--timeout", repr(timeout_s * 0.6)]  # fmt: skip
    d = _run_json(argv, timeout_s, "memory load")
    return MemoryResult(
        streams_open=int(d["streams_open"]),
        rss_before_kib={str(k): int(v) for k, v in d["rss_before_kib"].items()},
        rss_open_kib={str(k): int(v) for k, v in d["rss_open_kib"].items()},
        open_s=float(d["open_s"]),
    )


def cores_for_max_rate() -> tuple[int, int] | None:
    """(target core, load core) when this process may use both; None on a single core."""
    allowed = os.sched_getaffinity(0)
    if {TARGET_CORE, LOAD_CORE} <= allowed:
        return TARGET_CORE, LOAD_CORE
    if len(allowed) >= 2:
        a, b, *_ = sorted(allowed)
        return a, b
    return None


def pin(pid: int, core: int) -> None:
    """Pin every thread of ``pid`` to ``core`` (threads it starts later inherit it)."""
    tasks = Path(f"/proc/{pid}/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [pid]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(tid, {core})


def max_rate_load(
    backend_port: int, url: str, streams: int, duration_s: float, warmup_s: float,
    target_pid: int | None, load_core: int | None, max_tokens: int = 0,
) -> LoadResult:  # fmt: skip
    """One max-rate window through ``url``, as a ``LoadResult`` (no latency samples);
    ``max_tokens`` per request, 0 for endless streams."""
    argv = [_python(), "-m", "bench.maxrate", "--port", str(backend_port), "--url", url,
            "--streams", str(streams), "--duration", repr(duration_s),
            "--warmup", repr(warmup_s), "--max-tokens", str(max_tokens)]  # fmt: skip
    if load_core is not None:
        argv += ["--core", str(load_core)]
    if target_pid is not None:
        argv += ["--cpu-pid", f"target={target_pid}"]
    d = _run_json(argv, duration_s + warmup_s + 60, "max-rate load")
    return LoadResult(
        tokens=int(d["tokens"]), requests_completed=int(d["requests"]),
        errors=int(d["errors"]), window_s=float(d["window_s"]), transit=EMPTY, ttft=EMPTY,
        gap=EMPTY, cpu_s={str(k): float(v) for k, v in d["cpu_s"].items()},
        loadgen_cpu_s=float(d["own_cpu_s"]), body_sha256=str(d["body_sha256"]),
        error_samples=tuple(str(e) for e in d["error_samples"]),
    )  # fmt: skip
