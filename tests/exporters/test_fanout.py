"""Fanout: each subscriber gets the events it takes; one failing breaks nothing, logs rarely."""

from __future__ import annotations

import inspect
import logging

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from exporters.fanout import ErrorLog, Fanout
from exporters.otel import OtelMetricsSink
from exporters.otel_spans import SpanRecorder
from exporters.prometheus import PrometheusSink
from proxy.advisor.observations import AdvisorObservations
from proxy.core.records import EVENTS, Backend, Outcome, RequestLabels, Sink
from proxy.core.timing import StreamTimer
from proxy.timeline.buffer import TimelineBuffer

BACKEND = Backend("vllm", "b")
LABELS = RequestLabels("chat", "m", BACKEND)
PROM_LABELS = {
    "gen_ai_operation_name": "chat",
    "gen_ai_provider_name": "vllm",
    "gen_ai_request_model": "m",
    "server_address": "b",
}


class Broken:
    """A subscriber taking every event, whose every method raises."""

    takes = EVENTS

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise RuntimeError(f"{name} broke")

        return fail


def _gap_count(metrics) -> int:
    (rm,) = metrics.resource_metrics
    for sm in rm.scope_metrics:
        for metric in sm.metrics:
            if metric.name == "gen_ai.client.operation.time_per_output_chunk":
                return sum(p.count for p in metric.data.data_points)
    return 0


def _stream(sink, trace_id: str = "") -> None:
    """One stream of three tokens through a real timer (1 ms, then 5 ms apart)."""
    timer = StreamTimer("r1", LABELS, arrival_ns=0, start_unix_ns=0, sink=sink)
    timer.trace_id = trace_id
    timer.forwarded(1_000)
    for ns in (10_000_000, 11_000_000, 16_000_000):
        timer.output(ns)
    timer.streamed = True
    timer.finish(20_000_000, Outcome.OK, 200)


def test_every_subscriber_gets_every_event_despite_a_broken_one(caplog):
    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    prom = PrometheusSink(registry)
    otel = OtelMetricsSink(MeterProvider(metric_readers=[reader]))
    now = [0.0]
    errors = ErrorLog(every_s=60.0, clock=lambda: now[0])
    fan = Fanout(prom, Broken(), Fanout(otel), errors=errors)  # nested: flattened
    assert len(fan.subscribers) == 3
    with caplog.at_level(logging.WARNING, logger="tokenstamp.telemetry"):
        _stream(fan, trace_id="ab" * 16)
        fan.decoder_error(BACKEND, "invalid_json")
        fan.unobserved(BACKEND, "body_not_json")
    gaps = "gen_ai_client_operation_time_per_output_chunk_seconds_count"
    assert registry.get_sample_value(gaps, PROM_LABELS) == 2
    assert _gap_count(reader.get_metrics_data()) == 2
    ttft = "gen_ai_server_time_to_first_token_seconds_sum"
    assert registry.get_sample_value(ttft, PROM_LABELS) == pytest.approx(0.010)
    # request_started, gap_recorder, first_token, phase (the first answer), gap x2,
    # request_finished, decoder_error, unobserved: 9 failures, 1 line
    assert errors.failures == 9
    (line,) = [r for r in caplog.records if r.name == "tokenstamp.telemetry"]
    assert "Broken.request_started raised RuntimeError" in line.getMessage()
    now[0] += 61.0
    with caplog.at_level(logging.WARNING, logger="tokenstamp.telemetry"):
        fan.request_started(LABELS)
    assert "(9 since the last line, 10 in total)" in caplog.records[-1].getMessage()


def test_a_sampled_streams_worst_gaps_carry_exemplars():
    registry = CollectorRegistry()
    _stream(PrometheusSink(registry), trace_id="cd" * 16)
    from prometheus_client.openmetrics.exposition import generate_latest

    text = generate_latest(registry).decode()
    gap_lines = [
        line
        for line in text.splitlines()
        if line.startswith("gen_ai_client_operation_time_per_output_chunk_seconds_bucket")
        and "trace_id" in line
    ]
    # The first gap (1 ms) and the new worst (5 ms) carry it; buckets keep the latest.
    assert {line.split('le="')[1].split('"')[0] for line in gap_lines} == {"0.001", "0.005"}
    assert all(f'trace_id="{"cd" * 16}"' in line for line in gap_lines)


def test_unsampled_streams_call_gap_with_three_arguments():
    calls: list[tuple] = []

    class ThreeArgs(PrometheusSink):
        def gap(self, labels, gap_s, request_id):  # an older sink without exemplars
            calls.append((labels, gap_s, request_id))

    _stream(ThreeArgs(CollectorRegistry()))
    assert [c[1] for c in calls] == pytest.approx([0.001, 0.005])


class Counting:
    """Takes what it is told to; has a method for every event, counting its calls."""

    def __init__(self, *takes: str) -> None:
        self.takes = takes
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        if name not in EVENTS:
            raise AttributeError(name)
        return lambda *args: self.calls.append(name)


def test_a_subscriber_is_called_for_what_it_takes_only():
    errors_only, gaps_too = Counting("decoder_error"), Counting("gap", "decoder_error")
    fan = Fanout(errors_only, gaps_too)
    fan.gap(LABELS, 0.02, "r")
    fan.decoder_error(BACKEND, "invalid_json")
    fan.unobserved(BACKEND, "body_not_json")  # nobody takes it: nothing happens
    fan.gap_recorder(LABELS, "r")(0.01)
    assert errors_only.calls == ["decoder_error"]
    assert gaps_too.calls == ["gap", "decoder_error", "gap"]


def test_an_event_nobody_takes_costs_no_call_of_a_subscriber():
    stalls_only = Counting("stall")
    fan = Fanout(stalls_only)
    _stream(fan)
    fan.gap_recorder(LABELS, "r")(0.01)
    assert stalls_only.calls == []


@pytest.mark.parametrize(
    ("takes", "message"),
    [
        (None, "names the events it takes"),
        ((), "names the events it takes"),
        (("gaps",), "'gaps' is not one of"),
        (("prefill_done",), "takes 'prefill_done' but has no method"),
    ],
)
def test_a_misdeclared_subscriber_fails_at_construction(takes, message):
    class Wrong:
        def stall(self, record): ...

    wrong = Wrong()
    if takes is not None:
        wrong.takes = takes
    with pytest.raises(TypeError, match=message):
        Fanout(wrong)


@pytest.mark.parametrize("cls", [PrometheusSink, OtelMetricsSink, SpanRecorder,
                                 TimelineBuffer, AdvisorObservations])  # fmt: skip
def test_every_subscriber_takes_its_events_with_the_sinks_signatures(cls):
    for event in cls.takes:
        ours = inspect.signature(getattr(cls, event)).parameters
        sink = inspect.signature(getattr(Sink, event)).parameters
        assert [(p.name, p.kind, p.default) for p in ours.values()] == [
            (p.name, p.kind, p.default) for p in sink.values()
        ], f"{cls.__name__}.{event}"


def test_gaps_without_exemplar_take_the_recorders_and_reach_every_subscriber():
    """Gaps under the stream's worst so far go through ``gap_recorder``: same counts, same sums."""
    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    prom = PrometheusSink(registry)
    otel = OtelMetricsSink(MeterProvider(metric_readers=[reader]))
    errors = ErrorLog(every_s=60.0)
    fan = Fanout(prom, Broken(), otel, errors=errors)
    timer = StreamTimer("r1", LABELS, arrival_ns=0, start_unix_ns=0, sink=fan)
    # gaps 5 ms (the worst: through ``gap``), then 1 ms and 2 ms (through the recorders)
    for ns in (10_000_000, 15_000_000, 16_000_000, 18_000_000):
        timer.output(ns)
    timer.finish(20_000_000, Outcome.OK, 200)
    gaps = "gen_ai_client_operation_time_per_output_chunk_seconds"
    assert registry.get_sample_value(gaps + "_count", PROM_LABELS) == 3
    assert registry.get_sample_value(gaps + "_sum", PROM_LABELS) == pytest.approx(0.008)
    assert _gap_count(reader.get_metrics_data()) == 3
    # the broken sink failed on every gap, each counted: gap_recorder, gap, and 2 recorded
    assert errors.failures >= 4


def test_a_single_gap_sink_hands_its_own_recorder_to_the_timer():
    """One gap-taking subscriber with a recorder: the timer calls it directly (no fan-out per
    token), as the fan-out calls the one subscriber of an event (inside a ``try``)."""
    prom = PrometheusSink(CollectorRegistry())
    fan = Fanout(prom, AdvisorObservations(BACKEND))
    recorder = fan.gap_recorder(LABELS, "r1")
    assert recorder == prom.gap_recorder(LABELS, "r1")
