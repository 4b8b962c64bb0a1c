"""What one load generator run measured, as it travels from the load process to the runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.stats import EMPTY, Summary


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one load run measured."""

    tokens: int
    """Token chunks received inside the window."""
    requests_completed: int
    """Requests read to their end (``[DONE]`` seen or body ended cleanly)."""
    errors: int
    """Requests that failed (status, connection, timeout)."""
    window_s: float
    """Length of the measured window as it happened."""
    transit: Summary
    """Receive time minus the backend's send stamp, per token."""
    ttft: Summary
    """Request sent to first token received, per request whose first token is in the window."""
    gap: Summary
    """Between consecutive token chunks of one stream, inside the window."""
    cpu_s: dict[str, float]
    """CPU seconds (user+sys) each ``--cpu-pid`` process used in the window."""
    loadgen_cpu_s: float
    """CPU seconds the load generator itself used in the window."""
    body_sha256: str = ""
    """With ``verify``: digest over every complete body (stamps masked), in request order."""
    error_samples: tuple[str, ...] = ()
    """The first few error messages."""
    last: Summary = EMPTY
    """With ``steps``: per send stamp (one lockstep step), the transit of its last token."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form."""
        return {
            "tokens": self.tokens,
            "requests_completed": self.requests_completed,
            "errors": self.errors,
            "window_s": self.window_s,
            "transit": self.transit.to_dict(),
            "ttft": self.ttft.to_dict(),
            "gap": self.gap.to_dict(),
            "cpu_s": dict(self.cpu_s),
            "loadgen_cpu_s": self.loadgen_cpu_s,
            "body_sha256": self.body_sha256,
            "error_samples": list(self.error_samples),
            "last": self.last.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoadResult:
        """Inverse of ``to_dict`` (for the runner reading a child's output)."""
        return cls(
            tokens=int(d["tokens"]),
            requests_completed=int(d["requests_completed"]),
            errors=int(d["errors"]),
            window_s=float(d["window_s"]),
            transit=Summary.from_dict(d["transit"]),
            ttft=Summary.from_dict(d["ttft"]),
            gap=Summary.from_dict(d["gap"]),
            cpu_s={str(k): float(v) for k, v in d["cpu_s"].items()},
            loadgen_cpu_s=float(d["loadgen_cpu_s"]),
            body_sha256=str(d.get("body_sha256", "")),
            error_samples=tuple(str(e) for e in d.get("error_samples", ())),
            last=Summary.from_dict(d["last"]) if "last" in d else EMPTY,
        )
