"""What the stall tests share: recording sinks and the simulator behind a proxy.

* ``StallRecorder``: the sink a ``BackendView`` reports to, keeping its stall
  and prefill records (fake-clock tests);
* ``RecordingSink``: a whole ``Sink`` around ``PrometheusSink`` that keeps
  every record while ``/metrics`` works as in production (real-HTTP tests,
  the real backends' ``recorder``);
* ``start_simulator``, ``simulator_proxy_config`` and ``stream_chat``: a
  built-in simulator profile on a real socket, the proxy's configuration in
  front of it, and one streaming client read to the end.

The check that the stall view logged no error is the ``no_view_errors``
fixture of ``tests/conftest.py``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import aiohttp

from exporters.prometheus import PrometheusSink
from proxy.config import HostPort, ProxyConfig
from proxy.core.records import (
    EVENTS,
    Backend,
    PrefillRecord,
    RequestLabels,
    RequestRecord,
    StallCause,
    StallRecord,
)
from simulator.engine import EngineConfig
from simulator.profile import BUILTIN_PROFILES
from simulator.server import create_app


class StallRecorder:
    """A sink for a ``BackendView``: keeps its stall and prefill records, in order."""

    def __init__(self) -> None:
        self.stalls: list[StallRecord] = []
        self.prefills: list[PrefillRecord] = []

    def stall(self, record: StallRecord) -> None:
        self.stalls.append(record)

    def prefill_done(self, record: PrefillRecord) -> None:
        self.prefills.append(record)

    def prefill(self, rid: str) -> PrefillRecord:
        """The one prefill record of request ``rid``."""
        (record,) = [p for p in self.prefills if p.request_id == rid]
        return record


class RecordingSink:
    """A fan-out subscriber that keeps every record and forwards to Prometheus."""

    takes = tuple(e for e in EVENTS if e != "phase")

    def __init__(self, inner: PrometheusSink) -> None:
        self.inner = inner
        self.requests: dict[str, RequestRecord] = {}
        self.stalls: list[StallRecord] = []
        self.prefills: dict[str, PrefillRecord] = {}
        self.gaps: defaultdict[str, list[float]] = defaultdict(list)
        self.first_tokens: dict[str, float] = {}
        """Live TTFT (seconds) of each request, as ``first_token`` reported it."""

    def request_started(self, labels: RequestLabels) -> None:
        self.inner.request_started(labels)

    def first_token(
        self,
        labels: RequestLabels,
        ttft_s: float,
        upstream_ttft_s: float | None,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        assert request_id not in self.first_tokens, f"second first token of {request_id}"
        self.first_tokens[request_id] = ttft_s
        self.inner.first_token(labels, ttft_s, upstream_ttft_s, request_id, trace_id)

    def gap(self, labels: RequestLabels, gap_s: float, request_id: str, trace_id: str = "") -> None:
        self.gaps[request_id].append(gap_s)
        self.inner.gap(labels, gap_s, request_id, trace_id)

    def request_finished(self, record: RequestRecord) -> None:
        self.requests[record.request_id] = record
        self.inner.request_finished(record)

    def decoder_error(self, backend: Backend, kind: str) -> None:
        self.inner.decoder_error(backend, kind)

    def unobserved(self, backend: Backend, reason: str) -> None:
        self.inner.unobserved(backend, reason)

    def stall(self, record: StallRecord) -> None:
        self.stalls.append(record)
        self.inner.stall(record)

    def prefill_done(self, record: PrefillRecord) -> None:
        self.prefills[record.request_id] = record
        self.inner.prefill_done(record)

    def stalls_of(self, request_id: str) -> list[StallRecord]:
        """Stalls of one stream, in order."""
        return [s for s in self.stalls if s.request_id == request_id]

    def stalls_caused_by(self, culprit: str) -> list[StallRecord]:
        """Stalls attributed (cause ``prefill``) to ``culprit``."""
        return [s for s in self.stalls if s.cause is StallCause.PREFILL and culprit in s.culprits]


async def start_simulator(aiohttp_server: Any, profile: str) -> str:
    """The simulator with built-in ``profile`` on a real loopback socket; its base URL.

    ``aiohttp_server`` is pytest-aiohttp's fixture: the server stops with the test.
    """
    sim = await aiohttp_server(create_app(EngineConfig(BUILTIN_PROFILES[profile])))
    return str(sim.make_url("")).rstrip("/")


def simulator_proxy_config(sim_url: str) -> ProxyConfig:
    """The proxy in front of the simulator: loopback, free ports, backend ``sim``, vLLM's API."""
    return ProxyConfig(
        upstream=sim_url,
        listen=HostPort("127.0.0.1", 0),
        admin=HostPort("127.0.0.1", 0),
        backend_name="sim",
        provider="vllm",
    )


async def stream_chat(session: aiohttp.ClientSession, url: str, i: int, max_tokens: int) -> None:
    """One streaming chat completion (prompt ``stream {i}``) through ``url``, read to the end."""
    body = {
        "model": "tokenstamp-sim",
        "messages": [{"role": "user", "content": f"stream {i}"}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        async for _ in resp.content.iter_any():
            pass
