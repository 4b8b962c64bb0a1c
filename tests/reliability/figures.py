"""The suite's figures: what was thrown at the proxy and what it survived.

Tests add to one ``Figures`` object per session; the conftest prints it as a
table at the end of the run (and docs/reliability.md quotes it).
Only passing tests report survivals, so a failure shows as a gap in the table.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Figures:
    """Counters and measurements collected across the reliability suite."""

    faults_injected: int = 0
    """Upstream, downstream, lifecycle and telemetry faults set up."""
    faults_survived: int = 0
    """Of those, the ones the proxy came through as specified."""
    bad_inputs: int = 0
    """Malformed streams, malformed requests and fuzz examples tried."""
    load_streams: int = 0
    """Streams completed under load and checked by hash."""
    load_bytes: int = 0
    """Bytes received by the load clients."""
    bytes_altered: int = 0
    """Streams whose received bytes differed from what the backend sent."""
    measures: dict[str, str] = field(default_factory=dict)
    """Named measurements (RSS growth, drain time...), already formatted."""

    @contextmanager
    def fault(self) -> Iterator[None]:
        """Count one injected fault; survived when the block ends without an exception."""
        self.faults_injected += 1
        yield
        self.faults_survived += 1

    def render(self) -> list[str]:
        """The table as lines of text."""
        rows = [
            ("faults injected / survived", f"{self.faults_injected} / {self.faults_survived}"),
            ("bad inputs tried (streams, requests, fuzz examples)", f"{self.bad_inputs}"),
            ("streams under load / bytes received", f"{self.load_streams} / {self.load_bytes}"),
            ("streams with bytes altered", f"{self.bytes_altered}"),
            *sorted(self.measures.items()),
        ]
        width = max(len(k) for k, _ in rows)
        return [f"{k:<{width}}  {v}" for k, v in rows]

    @property
    def empty(self) -> bool:
        """Nothing was recorded (the suite did not run)."""
        return not (self.faults_injected or self.bad_inputs or self.load_streams or self.measures)
