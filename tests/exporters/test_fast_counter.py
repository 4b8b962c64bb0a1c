"""The lock-free counter and gauge: byte for byte prometheus_client's exposition, all three."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from exporters import protobuf_exposition
from exporters.fast_counter import FastCounter, FastGauge
from exporters.prometheus import PrometheusSink
from proxy.core.records import Backend, Outcome, RequestLabels, RequestRecord

Render = Callable[[CollectorRegistry], bytes]
RENDERS: dict[str, Render] = {
    "text": generate_latest,
    "openmetrics": generate_openmetrics,
    "protobuf": protobuf_exposition.encode,
}
LABELS = ("operation", "server_address")
# Label values as they come: plain, and what each exposition must escape or encode.
VALUES = [
    ("chat", "10.0.0.1:8000"),
    ("chat", 'quote " inside'),
    ("text_completion", "back\\slash"),
    ("chat", "new\nline"),
    ("embeddings", "ünïcødé ✓"),
    ("", ""),
]


class Pair:
    """Our families and prometheus_client's, each in a registry of its own, fed alike."""

    def __init__(self) -> None:
        self.ours, self.theirs = CollectorRegistry(), CollectorRegistry()
        self.counter = FastCounter("tokenstamp_things", "Things (x).", LABELS, self.ours)
        self.gauge = FastGauge("tokenstamp_open", "Open (y).", LABELS, self.ours)
        self.ref_counter = Counter("tokenstamp_things", "Things (x).", LABELS, registry=self.theirs)
        self.ref_gauge = Gauge("tokenstamp_open", "Open (y).", LABELS, registry=self.theirs)

    def inc(self, values: tuple[str, str], amount: float) -> None:
        child = self.counter.labels(*values)
        child.inc(amount)
        ref = self.ref_counter.labels(*values)
        ref.inc(amount)
        child.created = ref._created  # the one thing that differs: when each was made

    def move(self, values: tuple[str, str], op: str, amount: float) -> None:
        getattr(self.gauge.labels(*values), op)(amount)
        getattr(self.ref_gauge.labels(*values), op)(amount)

    def assert_same(self) -> None:
        for name, render in RENDERS.items():
            assert render(self.ours) == render(self.theirs), name


OPS = st.lists(
    st.tuples(
        st.sampled_from(["inc_counter", "inc", "dec", "set"]),
        st.integers(0, len(VALUES) - 1),
        st.sampled_from([0.0, 1.0, 0.1, 0.2, 1e-9, 3.5, 1e300, 2.0**53, 7.25]),
    ),
    max_size=40,
)


@given(OPS)
@settings(max_examples=200, deadline=None)
def test_every_exposition_is_byte_identical(ops: list[tuple[str, int, float]]) -> None:
    pair = Pair()
    for op, i, amount in ops:
        if op == "inc_counter":
            pair.inc(VALUES[i], amount)
        else:
            pair.move(VALUES[i], op, -amount if op == "set" and i % 2 else amount)
    pair.assert_same()


@pytest.fixture
def created_disabled() -> Iterator[None]:
    disable_created_metrics()
    try:
        yield
    finally:
        enable_created_metrics()


def test_created_series_follow_prometheus_clients_switch(created_disabled: None) -> None:
    pair = Pair()
    pair.inc(VALUES[0], 2.0)
    pair.assert_same()
    assert b"_created" not in generate_latest(pair.ours)


def test_created_is_the_childs_creation_time() -> None:
    reg = CollectorRegistry()
    counter = FastCounter("c", "doc", ("a",), reg)
    child = counter.labels("x")
    child.inc()
    child.created = 1700000000.5
    text = generate_latest(reg).decode()
    assert 'c_total{a="x"} 1.0' in text
    assert 'c_created{a="x"} 1.7000000005e+09' in text


def test_misuse_is_refused_as_prometheus_client_refuses_it() -> None:
    reg = CollectorRegistry()
    counter = FastCounter("c", "doc", ("a",), reg)
    with pytest.raises(ValueError, match="expected 1 label values"):
        counter.labels("x", "y")
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("x").inc(-1)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("c", "doc", ("a",), registry=reg)
    with pytest.raises(ValueError, match="without its _total suffix"):
        FastCounter("d_total", "doc", ("a",), reg)
    with pytest.raises(ValueError, match="has labels"):
        FastGauge("g", "doc", (), reg)


def test_a_removed_gauge_child_leaves_the_exposition() -> None:
    pair = Pair()
    pair.move(VALUES[0], "set", 4.0)
    pair.move(VALUES[1], "set", 5.0)
    pair.gauge.remove(*VALUES[0])
    pair.ref_gauge.remove(*VALUES[0])
    pair.assert_same()


def _record(outcome: Outcome, code: int, error: str) -> RequestRecord:
    labels = RequestLabels("chat", "m", Backend("vllm", "gpu-0:8000"), 'team "a"')
    return RequestRecord(
        request_id="r",
        labels=labels,
        streamed=True,
        outcome=outcome,
        status_code=code,
        error_type=error,
        arrival_ns=0,
        forwarded_ns=1_000,
        first_token_ns=50_000_000,
        last_token_ns=90_000_000,
        end_ns=100_000_000,
        start_unix_ns=0,
        output_events=5,
        gap_count=4,
        max_gap_ns=15_000_000,
        prompt_tokens=12,
        completion_tokens=5,
        cached_tokens=None,
        finish_reasons=("stop",),
        response_model="m",
        response_id="x",
        request_model="m",
    )


def test_the_sinks_counters_and_gauge_count_each_request_once() -> None:
    """The sink's request counter, in-flight gauge and their ``_created`` series."""
    reg = CollectorRegistry()
    sink = PrometheusSink(reg, tenants=True)
    labels = _record(Outcome.OK, 200, "").labels
    for outcome, code, error in [
        (Outcome.OK, 200, ""),
        (Outcome.OK, 200, ""),
        (Outcome.UPSTREAM_ERROR, 502, "connect"),
    ]:
        sink.request_started(labels)
        sink.request_finished(_record(outcome, code, error))
    sink.request_started(labels)
    request = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "vllm",
        "gen_ai_request_model": "m",
        "server_address": "gpu-0:8000",
        "tokenstamp_tenant": 'team "a"',
    }
    assert reg.get_sample_value("tokenstamp_streams_active", request) == 1.0
    ok = {**request, "tokenstamp_outcome": "ok", "http_response_status_code": "2xx"}
    failed = {**request, "tokenstamp_outcome": "upstream_error"}
    failed["http_response_status_code"] = "5xx"
    assert reg.get_sample_value("tokenstamp_requests_total", {**ok, "error_type": ""}) == 2.0
    assert (
        reg.get_sample_value("tokenstamp_requests_total", {**failed, "error_type": "connect"})
        == 1.0
    )
    created = reg.get_sample_value("tokenstamp_requests_created", {**ok, "error_type": ""})
    assert created is not None
    assert created > 1.6e9
