"""An in-test OTLP/HTTP collector: what the proxy's exporters send, decoded.

Shared by the OTLP tests and the native-histogram dashboards test (a fixture in
``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass, field

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan


@dataclass
class Collector:
    """What the in-test OTLP/HTTP collector received."""

    url: str = ""
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    delay_s: float = 0.0
    content_types: set[str] = field(default_factory=set)

    def spans(self) -> list[ProtoSpan]:
        return [
            span
            for req in self.traces
            for rs in req.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]


async def start_collector(aiohttp_server) -> Collector:
    got = Collector()

    async def payload(request: web.Request) -> bytes:
        got.content_types.add(request.content_type)
        data = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            data = gzip.decompress(data)
        if got.delay_s:
            await asyncio.sleep(got.delay_s)
        return data

    async def traces(request: web.Request) -> web.Response:
        got.traces.append(ExportTraceServiceRequest.FromString(await payload(request)))
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    async def metrics(request: web.Request) -> web.Response:
        got.metrics.append(ExportMetricsServiceRequest.FromString(await payload(request)))
        answer = ExportMetricsServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    app.router.add_post("/v1/metrics", metrics)
    server = await aiohttp_server(app)
    got.url = str(server.make_url("")).rstrip("/")
    return got
