"""What a benchmark run was asked to do, what each load measured, and the medians over rounds.

Pure data and arithmetic: the runner (``bench.run``) fills these in, the
report and the plot read them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.memload import MemoryResult
from bench.result import LoadResult
from bench.stats import EMPTY, Summary, median, median_summary
from bench.targets import DIRECT, PASSTHROUGH, TargetSpec

STEADY = "steady"
"""Every stream on its own timer at ``rate_per_s``."""
LOCKSTEP = "lockstep"
"""Every open stream's next token written in one backend step, ``step_rate_per_s`` steps/s."""
MAX_RATE = "max-rate"
"""Target pinned to one core, closed loop at one token per read: requests/s and tokens/s
(``max_tokens`` 0: endless streams, tokens/s only)."""
SCENARIOS = (STEADY, LOCKSTEP, MAX_RATE)
"""Every scenario, in the order ``--scenario all`` runs them."""
UNCHECKED = "-"
"""Body digest of a scenario that does not compare bodies (max-rate)."""


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
    """Tokens per request; 0 (max-rate only): endless streams."""
    warmup_s: float = 1.0
    """Seconds of load before each window opens."""
    scenario: str = STEADY
    """One of ``SCENARIOS``."""
    step_rate_per_s: float = 25.0
    """Lockstep steps per second."""
    memory_streams: int = 0
    """Open streams for the memory figure (steady and lockstep); 0: not measured."""
    tokens_per_write: int = 1
    """Steady: content chunks each stream's backend writes at once (each read carries them)."""

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
    def cpu_us_per_request(self) -> float:
        """Target CPU microseconds per request ended (NaN for ``direct`` or no request ended)."""
        cpu = self.load.cpu_s.get("target", math.nan)
        n = self.load.requests_completed
        return cpu / n * 1e6 if n else math.nan

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
    last: Summary = EMPTY
    """Lockstep: transit of each step's last-delivered token, median over rounds."""
    extra_last_p50_ms: float = math.nan
    """``last`` p50 minus the direct target's."""
    extra_last_p99_ms: float = math.nan
    """``last`` p99 minus the direct target's."""
    tokens_per_s: float = math.nan
    """Tokens received per second of window, median over rounds."""
    requests_per_s: float = math.nan
    """Max-rate with a request length: requests ended per second of window, median over
    rounds (NaN: endless streams, or another scenario)."""
    cpu_us_per_request: float = math.nan
    """Max-rate with a request length: target CPU µs per request ended, median over rounds."""
    target_cpu_cores: float = math.nan
    """Target CPU seconds per second of window (1.0: one core saturated), median over rounds."""
    load_cpu_cores: float = math.nan
    """The same for the load generator."""
    memory_kib_per_stream: float = math.nan
    """(RSS with ``memory_streams`` open - RSS before) / streams, KiB (NaN: not measured)."""


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
    skipped: tuple[tuple[str, str], ...] = ()
    """Targets not run on this machine, with the reason."""
    memory: tuple[tuple[str, MemoryResult], ...] = field(default=())
    """The memory measurement of every target it was taken for."""


def _per_window(rs: Sequence[RoundResult], amount: Callable[[LoadResult], float]) -> float:
    return median(amount(r.load) / r.load.window_s if r.load.window_s > 0 else math.nan for r in rs)


def _ended(load: LoadResult) -> float:
    return load.requests_completed


def aggregate(
    options: BenchOptions,
    results: Sequence[RoundResult],
    digests: dict[str, str],
    memory: Mapping[str, MemoryResult] | None = None,
) -> tuple[TargetRow, ...]:
    """Per-target medians over rounds, with differences to ``direct`` and ratios to the baseline."""
    by_name = {t.name: [r for r in results if r.target == t.name] for t in options.targets}
    transit = {n: median_summary([r.load.transit for r in rs]) for n, rs in by_name.items()}
    last = {n: median_summary([r.load.last for r in rs]) for n, rs in by_name.items()}
    direct_last = last.get(DIRECT)
    cpu = {n: median(r.cpu_us_per_token for r in rs) for n, rs in by_name.items()}
    direct = transit.get(DIRECT)
    base_cpu = cpu.get(PASSTHROUGH, math.nan)
    reference = digests.get(DIRECT) or digests.get(options.targets[0].name, "")
    finite_rate = options.scenario == MAX_RATE and options.max_tokens > 0
    rows: list[TargetRow] = []
    for t in options.targets:
        rs = by_name[t.name]
        s, ls = transit[t.name], last[t.name]
        mem = (memory or {}).get(t.name)
        dl = direct_last if direct_last is not None and not t.is_direct else None
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
                last=ls,
                extra_last_p50_ms=ls.p50_ms - dl.p50_ms if dl else math.nan,
                extra_last_p99_ms=ls.p99_ms - dl.p99_ms if dl else math.nan,
                tokens_per_s=_per_window(rs, lambda load: load.tokens),
                requests_per_s=_per_window(rs, _ended) if finite_rate else math.nan,
                cpu_us_per_request=median(r.cpu_us_per_request for r in rs)
                if finite_rate
                else math.nan,
                target_cpu_cores=_per_window(rs, lambda load: load.cpu_s.get("target", math.nan)),
                load_cpu_cores=_per_window(rs, lambda load: load.loadgen_cpu_s),
                memory_kib_per_stream=mem.kib_per_stream("target") if mem else math.nan,
            )
        )
    return tuple(rows)
