"""What the proxy measured, kept for the tests: a recording sink and a recording watcher.

Nothing is replaced: ``/metrics`` and the stall view work as in production
while the test reads the same observations back:

* ``PhaseRecordingSink``, ``tests.stallkit``'s ``RecordingSink`` around
  ``PrometheusSink`` that also takes ``Sink.phase``: request records, stall
  records, prefill records, gaps, and each live phase (time to first answer,
  reasoning's duration), which ``/metrics`` then holds as in production;
* ``RecordingWatcher``, the extra watcher ``start_proxy`` takes beside its
  stall view: the stamp of every output event per request (first token, then
  the end of every gap), absolute on the monotonic clock, so they compare with
  the client's stamps one by one.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from exporters.prometheus import PrometheusSink
from proxy.config import ProxyConfig
from proxy.core.records import EVENTS, Phase, RequestLabels
from proxy.edge.server import RunningProxy, start_proxy
from tests.stallkit import RecordingSink


class PhaseRecordingSink(RecordingSink):
    """A ``RecordingSink`` that also keeps and forwards the live phases (``Sink.phase``)."""

    takes = EVENTS

    def __init__(self, inner: PrometheusSink) -> None:
        super().__init__(inner)
        self.phases: defaultdict[str, dict[Phase, float]] = defaultdict(dict)
        """Seconds of each phase of each request, as ``phase`` reported them."""

    def phase(
        self,
        labels: RequestLabels,
        phase: Phase,
        seconds: float,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        assert phase not in self.phases[request_id], f"second {phase} of {request_id}"
        self.phases[request_id][phase] = seconds
        self.inner.phase(labels, phase, seconds, request_id, trace_id)


class RecordingWatcher:
    """A ``StreamWatcher`` that keeps every stamp (the proxy calls it after its stall view)."""

    def __init__(self) -> None:
        self.forwarded_ns: dict[str, int] = {}
        self.output_ns: defaultdict[str, list[int]] = defaultdict(list)
        self.finished_ns: dict[str, int] = {}

    def forwarded(self, request_id: str, forwarded_ns: int) -> None:
        self.forwarded_ns[request_id] = forwarded_ns

    def first_token(self, request_id: str, first_token_ns: int) -> None:
        self.output_ns[request_id].append(first_token_ns)

    def gap(self, request_id: str, start_ns: int, end_ns: int) -> None:
        self.output_ns[request_id].append(end_ns)

    def finished(self, request_id: str, end_ns: int) -> None:
        self.finished_ns[request_id] = end_ns


ProxyFactory = Callable[..., Awaitable["RecordedProxy"]]
"""The ``recorded_proxy`` fixture: ``await make(upstream_url, **config_overrides)``."""


class RecordedProxy:
    """A proxy started in-process with the recorders wired in."""

    def __init__(
        self, running: RunningProxy, sink: PhaseRecordingSink, watcher: RecordingWatcher
    ) -> None:
        self.running = running
        self.sink = sink
        self.watcher = watcher
        self.url = running.url
        self.admin_url = running.admin_url

    def settle(self) -> None:
        """Let the stall view report everything that can be final by now."""
        if self.running.stalls is not None:
            self.running.stalls.flush(time.monotonic_ns())


async def start_recorded_proxy(config: ProxyConfig) -> RecordedProxy:
    """``start_proxy`` with a ``PhaseRecordingSink`` and a ``RecordingWatcher``."""
    registry = CollectorRegistry()
    prom = PrometheusSink(registry)
    prom.slo_ttft_s = config.slo_ttft_s
    prom.slo_tpot_s = config.slo_tpot_s
    prom.slo_answer_ttft_s = config.slo_answer_ttft_s or None
    sink = PhaseRecordingSink(prom)
    watcher = RecordingWatcher()
    running = await start_proxy(config, registry=registry, sink=sink, watcher=watcher)
    return RecordedProxy(running, sink, watcher)
