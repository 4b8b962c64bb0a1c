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

Every child is stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.children import Child, ChildError, Children, free_ports
from bench.loadgen import LoadResult
from bench.stats import Summary, median, median_summary
from bench.targets import DIRECT, PASSTHROUGH, TargetSpec

_VERIFY_STREAMS = 4
_VERIFY_TOKENS = 20
_SETTLE_S = 0.3
"""Pause between loads, so a target finishes closing the last load's streams."""


class BenchError(RuntimeError):
    """The benchmark could not run (a child failed, a load failed)."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What to run."""

    targets: tuple[TargetSpec, ...]
    """Targets in the order of the first round."""
    streams: int = 64
    """Concurrent streams per load."""
    rate_per_s: float = 50.0
    """Tokens per second per stream (the backend's pace)."""
    duration_s: float = 10.0
    """Measured seconds per target, split evenly over the rounds."""
    rounds: int = 3
    """Rounds; each runs every target once."""
    max_tokens: int = 200
    """Tokens per request."""
    warmup_s: float = 1.0
    """Seconds of load before each window opens."""

    @property
    def window_s(self) -> float:
        """Measured seconds of one load."""
        return self.duration_s / self.rounds


@dataclass(frozen=True, slots=True)
class RoundResult:
    """One load against one target."""

    target: str
    """Target name."""
    round: int
    """Round number, from 0."""
    load: LoadResult
    """What the load generator measured."""

    @property
    def cpu_us_per_token(self) -> float:
        """Target CPU microseconds per token relayed (NaN for ``direct`` or no tokens)."""
        cpu = self.load.cpu_s.get("target", math.nan)
        return cpu / self.load.tokens * 1e6 if self.load.tokens else math.nan

    @property
    def backend_us_per_token(self) -> float:
        """Backend CPU microseconds per token."""
        cpu = self.load.cpu_s.get("backend", math.nan)
        return cpu / self.load.tokens * 1e6 if self.load.tokens else math.nan

    @property
    def loadgen_us_per_token(self) -> float:
        """Load generator CPU microseconds per token."""
        return self.load.loadgen_cpu_s / self.load.tokens * 1e6 if self.load.tokens else math.nan


@dataclass(frozen=True, slots=True)
class TargetRow:
    """One line of the report: medians over rounds."""

    name: str
    """Target name."""
    tokens: int
    """Tokens received in all windows together."""
    errors: int
    """Failed requests in all loads together."""
    transit: Summary
    """Per-token transit, median over rounds of each statistic."""
    gap: Summary
    """Client-side inter-token gap, median over rounds."""
    ttft: Summary
    """Client-side time to first token, median over rounds."""
    extra_p50_ms: float
    """Transit p50 minus the direct target's (NaN without ``direct``)."""
    extra_p99_ms: float
    """Transit p99 minus the direct target's (NaN without ``direct``)."""
    cpu_us_per_token: float
    """Median over rounds of the target's CPU per token (NaN for ``direct``)."""
    cpu_ratio: float
    """CPU per token over the pass-through's (NaN without ``passthrough``)."""
    backend_us_per_token: float
    """Median backend CPU per token during this target's loads."""
    loadgen_us_per_token: float
    """Median load generator CPU per token during this target's loads."""
    body_sha256: str
    """Digest of the verification bodies (stamps masked)."""
    identical: bool
    """Verification bodies are byte-identical to the direct ones (or to the first target's)."""


@dataclass(frozen=True, slots=True)
class BenchReport:
    """Everything one run measured."""

    options: BenchOptions
    """What was run."""
    rows: tuple[TargetRow, ...]
    """One per target, in ``options.targets`` order."""
    rounds: tuple[RoundResult, ...]
    """Every load, in the order run."""
    elapsed_s: float
    """Wall time of the whole run."""


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


def aggregate(
    options: BenchOptions, results: Sequence[RoundResult], digests: dict[str, str]
) -> tuple[TargetRow, ...]:
    """Per-target medians over rounds, with differences to ``direct`` and ratios to the baseline."""
    by_name = {t.name: [r for r in results if r.target == t.name] for t in options.targets}
    transit = {n: median_summary([r.load.transit for r in rs]) for n, rs in by_name.items()}
    cpu = {n: median(r.cpu_us_per_token for r in rs) for n, rs in by_name.items()}
    direct = transit.get(DIRECT)
    base_cpu = cpu.get(PASSTHROUGH, math.nan)
    reference = digests.get(DIRECT) or digests.get(options.targets[0].name, "")
    rows: list[TargetRow] = []
    for t in options.targets:
        rs = by_name[t.name]
        s = transit[t.name]
        rows.append(
            TargetRow(
                name=t.name,
                tokens=sum(r.load.tokens for r in rs),
                errors=sum(r.load.errors for r in rs),
                transit=s,
                gap=median_summary([r.load.gap for r in rs]),
                ttft=median_summary([r.load.ttft for r in rs]),
                extra_p50_ms=s.p50_ms - direct.p50_ms if direct and not t.is_direct else math.nan,
                extra_p99_ms=s.p99_ms - direct.p99_ms if direct and not t.is_direct else math.nan,
                cpu_us_per_token=cpu[t.name],
                cpu_ratio=cpu[t.name] / base_cpu if base_cpu > 0 else math.nan,
                backend_us_per_token=median(r.backend_us_per_token for r in rs),
                loadgen_us_per_token=median(r.loadgen_us_per_token for r in rs),
                body_sha256=digests.get(t.name, ""),
                identical=bool(reference) and digests.get(t.name) == reference,
            )
        )
    return tuple(rows)


def loadgen_args(**flags: object) -> list[str]:
    """``--flag value`` pairs for ``bench.loadgen`` (underscores become dashes; ``True`` alone)."""
    out: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
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

    backend: Child
    """The stamping backend."""
    urls: dict[str, str]
    """Base URL of every target, by name."""
    procs: dict[str, Child]
    """Process of every target that has one, by name."""


def _start(children: Children, options: BenchOptions) -> _Started:
    py = _python()
    backend_port, *ports = free_ports(1 + 2 * len(options.targets))
    upstream = f"http://127.0.0.1:{backend_port}"
    backend = children.start("backend", [
        py, "-m", "bench.backend", "--port", str(backend_port),
        "--rate", repr(options.rate_per_s), "--max-tokens", str(options.max_tokens),
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
        }  # fmt: skip
        procs[t.name] = children.start(t.name, t.command(values), dict(t.env))
        urls[t.name] = f"http://127.0.0.1:{port}"
    for name, child in procs.items():
        child.wait_listening(int(urls[name].rpartition(":")[2]))
    return _Started(backend, urls, procs)


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
    for r in range(options.rounds):
        for t in rotated(options.targets, r):
            pids = [f"backend={started.backend.pid}"]
            proc = started.procs.get(t.name)
            if proc is not None:
                proc.check_alive()
                pids.append(f"target={proc.pid}")
            args = loadgen_args(url=started.urls[t.name], streams=options.streams,
                                max_tokens=options.max_tokens, duration=repr(window),
                                warmup=repr(warmup), label=f"round{r}", cpu_pid=pids,
                                timeout=repr(window + warmup + 30))  # fmt: skip
            res = run_load(args, timeout_s=window + warmup + 40)
            if res.tokens == 0:
                raise BenchError(f"{t.name}: no tokens received; errors: {res.error_samples}")
            results.append(RoundResult(t.name, r, res))
            log(f"round {r + 1}/{options.rounds} {t.name}: {res.tokens} tokens, transit "
                f"p50 {res.transit.p50_ms:.3f} ms p99 {res.transit.p99_ms:.3f} ms, "
                f"cpu {results[-1].cpu_us_per_token:.1f} us/token")  # fmt: skip
            time.sleep(_SETTLE_S)
    return results


def run_bench(options: BenchOptions, log: Callable[[str], None] = print) -> BenchReport:
    """Run the whole benchmark; every child process is stopped before this returns or raises."""
    if options.rounds < 1 or options.streams < 1 or options.duration_s <= 0:
        raise ValueError("rounds and streams must be >= 1 and duration > 0")
    started_s = time.monotonic()
    with Children() as children:
        started = _start(children, options)
        log(f"backend and {len(options.targets)} targets up; verifying byte identity")
        digests = _verify(options, started)
        results = _measure(options, started, log)
        for name, child in started.procs.items():
            try:
                child.check_alive()
            except ChildError as exc:
                raise BenchError(f"{name} died during the run: {exc}") from None
    return BenchReport(
        options=options,
        rows=aggregate(options, results, digests),
        rounds=tuple(results),
        elapsed_s=time.monotonic() - started_s,
    )
