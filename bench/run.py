"""One benchmark run: the backend, every target and the load, each in its own process.

Order of a run:

1. start the stamping backend and every target on free loopback ports;
2. verify: a few complete requests through each target (half of them asking
   for usage, half not), every body hashed with the send stamps masked; a
   faithful proxy yields the direct run's digest (this also warms each up);
3. measure in rounds: each round runs the same load against every target once,
   the order rotating by one per round, so slow drift of a shared machine
   spreads over all targets; each load is a fresh ``python -m bench.loadgen``
   process, which reads the target's CPU time at its window's edges;
4. report per target the median over rounds.

Scenarios (one per run; ``tokenstamp bench --scenario`` runs several in turn):
``steady`` (every stream on its own timer), ``lockstep`` (the backend writes
every open stream's next token in one step, as an engine does; the load also
keeps each step's last-delivered token) and ``max-rate`` (each target pinned to
one core, a closed loop at one token per read: requests/s, tokens/s and CPU, no
latency; with a request length every ended body is compared with the backend's
during the load itself, endless streams are not compared). With ``memory_streams``,
steady and lockstep also measure the target's RSS per open stream right after
verification.

A target whose program is missing (nginx) is skipped and named in the report.
Every child is stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from bench.children import Child, ChildError, Children, free_ports
from bench.memload import MemoryResult
from bench.phases import (
    PhaseError,
    cores_for_max_rate,
    max_rate_load,
    measure_memory,
    pin,
    raise_open_files_limit,
)
from bench.result import LoadResult
from bench.rows import (
    LOCKSTEP,
    MAX_RATE,
    SCENARIOS,
    STEADY,
    UNCHECKED,
    BenchOptions,
    BenchReport,
    RoundResult,
    TargetRow,
    aggregate,
)
from bench.targets import TargetSpec

__all__ = [
    "LOCKSTEP", "MAX_RATE", "SCENARIOS", "STEADY", "BenchError", "BenchOptions", "BenchReport",
    "RoundResult", "TargetRow", "aggregate", "loadgen_args", "rotated", "run_bench", "run_load",
]  # fmt: skip

_VERIFY_STREAMS = 4
_VERIFY_TOKENS = 20
_SETTLE_S = 0.3
"""Pause between loads, so a target finishes closing the last load's streams."""


class BenchError(RuntimeError):
    """The benchmark could not run (a child failed, a load failed)."""


def _python() -> str:
    return sys.executable or "python3"


def run_load(argv_tail: Sequence[str], timeout_s: float) -> LoadResult:
    """Run ``python -m bench.loadgen ARGS`` and parse its JSON result."""
    argv = [_python(), "-m", "bench.loadgen", *argv_tail]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"load generator did not finish within {timeout_s:g} s") from None
    if done.returncode != 0:
        tail = done.stderr[-2000:].decode(errors="replace")
        raise BenchError(f"load generator failed (status {done.returncode}):\n{tail}")
    try:
        return LoadResult.from_dict(json.loads(done.stdout))
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"load generator printed no result: {exc}") from None


def rotated(targets: Sequence[TargetSpec], round_index: int) -> list[TargetSpec]:
    """The targets starting at position ``round_index`` (mod their count)."""
    k = round_index % len(targets)
    return [*targets[k:], *targets[:k]]


def loadgen_args(**flags: object) -> list[str]:
    """``--flag value`` pairs for ``bench.loadgen`` (underscores become dashes; ``True`` alone,
    ``False`` left out)."""
    out: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


@dataclass(frozen=True, slots=True)
class _Started:
    """The running processes of one benchmark."""

    backend: Child | None
    """The stamping backend (None for max-rate: each load brings its own)."""
    backend_port: int
    """The port every target's upstream points at."""
    urls: dict[str, str]
    """Base URL of every target, by name."""
    procs: dict[str, Child]
    """Process of every target that has one, by name."""


def _start(children: Children, options: BenchOptions) -> _Started:
    py = _python()
    backend_port, *ports = free_ports(1 + 2 * len(options.targets))
    upstream = f"http://127.0.0.1:{backend_port}"
    backend: Child | None = None
    if options.scenario != MAX_RATE:
        step_rate = options.step_rate_per_s if options.scenario == LOCKSTEP else 0.0
        backend = children.start("backend", [
            py, "-m", "bench.backend", "--port", str(backend_port),
            "--rate", repr(options.rate_per_s), "--max-tokens", str(options.max_tokens),
            "--step-rate", repr(step_rate), "--tokens-per-write", str(options.tokens_per_write),
        ])  # fmt: skip
        backend.wait_listening(backend_port)
    urls: dict[str, str] = {}
    procs: dict[str, Child] = {}
    for i, t in enumerate(options.targets):
        if t.is_direct:
            urls[t.name] = upstream
            continue
        port, admin_port = ports[2 * i], ports[2 * i + 1]
        values = {
            "python": py, "upstream": upstream, "port": str(port), "admin_port": str(admin_port),
            "listen": f"127.0.0.1:{port}", "admin": f"127.0.0.1:{admin_port}",
            "workdir": str(children.workdir(t.name)),
        }  # fmt: skip
        procs[t.name] = children.start(t.name, t.command(values), dict(t.env))
        urls[t.name] = f"http://127.0.0.1:{port}"
    for name, child in procs.items():
        child.wait_listening(int(urls[name].rpartition(":")[2]))
    return _Started(backend, backend_port, urls, procs)


def _verify(options: BenchOptions, started: _Started) -> dict[str, str]:
    """Digest of the same few complete answers through every target."""
    digests: dict[str, str] = {}
    for t in options.targets:
        args = loadgen_args(url=started.urls[t.name], streams=_VERIFY_STREAMS, requests=1,
                            max_tokens=_VERIFY_TOKENS, usage="alternate", verify=True,
                            label="verify", timeout=30)  # fmt: skip
        res = run_load(args, timeout_s=40)
        if res.errors or res.requests_completed != _VERIFY_STREAMS:
            raise BenchError(f"{t.name}: verification requests failed: {res.error_samples}")
        digests[t.name] = res.body_sha256
    return digests


def _measure(
    options: BenchOptions, started: _Started, log: Callable[[str], None]
) -> list[RoundResult]:
    results: list[RoundResult] = []
    window, warmup = options.window_s, options.warmup_s
    cores = cores_for_max_rate() if options.scenario == MAX_RATE else None
    if cores is not None:
        for child in started.procs.values():
            pin(child.pid, cores[0])
    for r in range(options.rounds):
        for t in rotated(options.targets, r):
            proc = started.procs.get(t.name)
            if proc is not None:
                proc.check_alive()
            if options.scenario == MAX_RATE:
                res = max_rate_load(started.backend_port, started.urls[t.name], options.streams,
                                    window, warmup, proc.pid if proc is not None else None,
                                    cores[1] if cores else None, options.max_tokens)  # fmt: skip
            else:
                pids = [f"backend={started.backend.pid}"] if started.backend is not None else []
                if proc is not None:
                    pids.append(f"target={proc.pid}")
                args = loadgen_args(url=started.urls[t.name], streams=options.streams,
                                    max_tokens=options.max_tokens, duration=repr(window),
                                    warmup=repr(warmup), label=f"round{r}", cpu_pid=pids,
                                    timeout=repr(window + warmup + 30),
                                    steps=options.scenario == LOCKSTEP)  # fmt: skip
                res = run_load(args, timeout_s=window + warmup + 40)
            if res.tokens == 0:
                raise BenchError(f"{t.name}: no tokens received; errors: {res.error_samples}")
            results.append(RoundResult(t.name, r, res))
            if options.scenario == MAX_RATE:
                log(f"round {r + 1}/{options.rounds} {t.name}: {res.tokens} tokens "
                    f"({res.tokens / res.window_s:.0f}/s), {res.requests_completed} requests "
                    f"({res.requests_completed / res.window_s:.0f}/s), {res.errors} errors, "
                    f"cpu {results[-1].cpu_us_per_token:.1f} us/token")  # fmt: skip
            else:
                log(f"round {r + 1}/{options.rounds} {t.name}: {res.tokens} tokens "
                    f"({res.tokens / res.window_s:.0f}/s), transit p50 "
                    f"{res.transit.p50_ms:.3f} ms p99 {res.transit.p99_ms:.3f} ms, "
                    f"cpu {results[-1].cpu_us_per_token:.1f} us/token")  # fmt: skip
            time.sleep(_SETTLE_S)
    return results


def _max_rate_digests(options: BenchOptions, results: Sequence[RoundResult]) -> dict[str, str]:
    """Per target, the body digest every max-rate round reported (each compared every ended
    body with the backend's); ``UNCHECKED`` for endless streams."""
    out: dict[str, str] = {}
    for t in options.targets:
        seen = {r.load.body_sha256 for r in results if r.target == t.name}
        if options.max_tokens == 0:
            out[t.name] = UNCHECKED
        elif len(seen) == 1:
            out[t.name] = seen.pop()
        else:
            out[t.name] = "rounds differ"
    return out


def _memory(
    options: BenchOptions, started: _Started, log: Callable[[str], None]
) -> dict[str, MemoryResult]:
    """RSS per open stream of every target process, one target after another."""
    out: dict[str, MemoryResult] = {}
    for t in options.targets:
        proc = started.procs.get(t.name)
        if proc is None:
            continue
        res = measure_memory(started.urls[t.name], proc.pid, options.memory_streams)
        if res.streams_open < options.memory_streams:
            log(f"memory {t.name}: only {res.streams_open} of {options.memory_streams} opened")
        out[t.name] = res
        log(f"memory {t.name}: {res.kib_per_stream('target'):.1f} KiB per open stream "
            f"({res.streams_open} streams, opened in {res.open_s:.1f} s)")  # fmt: skip
        time.sleep(_SETTLE_S)
    return out


def run_bench(options: BenchOptions, log: Callable[[str], None] = print) -> BenchReport:
    """Run the whole benchmark; every child process is stopped before this returns or raises."""
    if options.rounds < 1 or options.streams < 1 or options.duration_s <= 0:
        raise ValueError("rounds and streams must be >= 1 and duration > 0")
    if options.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {options.scenario!r} (one of {', '.join(SCENARIOS)})")
    started_s = time.monotonic()
    skipped = tuple((t.name, t.missing()) for t in options.targets if t.missing())
    for name, why in skipped:
        log(f"skipping {name}: {why}")
    options = replace(options, targets=tuple(t for t in options.targets if not t.missing()))
    if not options.targets:
        raise BenchError("no target can run on this machine")
    raise_open_files_limit()  # a thousand open streams are two thousand sockets in a proxy
    memory: dict[str, MemoryResult] = {}
    try:
        with Children() as children:
            started = _start(children, options)
            log(f"{options.scenario}: {len(options.targets)} targets up")
            if options.scenario == MAX_RATE:
                digests = {}
            else:
                digests = _verify(options, started)
                if options.memory_streams > 0:
                    memory = _memory(options, started, log)
            results = _measure(options, started, log)
            if options.scenario == MAX_RATE:
                digests = _max_rate_digests(options, results)
            for name, child in started.procs.items():
                try:
                    child.check_alive()
                except ChildError as exc:
                    raise BenchError(f"{name} died during the run: {exc}") from None
    except PhaseError as exc:
        raise BenchError(str(exc)) from None
    return BenchReport(
        options=options,
        rows=aggregate(options, results, digests, memory),
        rounds=tuple(results),
        elapsed_s=time.monotonic() - started_s,
        skipped=skipped,
        memory=tuple(memory.items()),
    )
