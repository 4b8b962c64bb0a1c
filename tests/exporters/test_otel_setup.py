"""OTLP settings from flags and ``OTEL_*``; the rate-limited export log; the serve flags."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ExponentialHistogram, InMemoryMetricReader
from opentelemetry.sdk.metrics.export import Histogram as ExplicitHistogram
from opentelemetry.sdk.metrics.view import (
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
)

from exporters import names
from exporters.names import HistogramAggregation
from exporters.otel import METER_NAME, histogram
from exporters.otel_setup import (
    ExportHealth,
    OtelConfigError,
    OtlpSettings,
    RateLimitFilter,
    Telemetry,
    export_timeout_s,
    histogram_views,
    otlp_settings,
    resource,
)
from proxy.config import ConfigError, config_from_argv

BASE = "http://collector:4318"


def test_off_without_an_endpoint():
    assert otlp_settings("", {}) == OtlpSettings()
    assert not OtlpSettings().enabled


def test_flag_or_standard_variable_gives_both_signal_urls():
    want = OtlpSettings(BASE + "/v1/traces", BASE + "/v1/metrics")
    assert otlp_settings(BASE + "/", {}) == want
    assert otlp_settings("", {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE}) == want
    # The flag wins over the variable.
    assert otlp_settings(BASE, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:1"}) == want


def test_per_signal_endpoints_and_exporter_switches():
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4318/v1/traces"}
    assert otlp_settings("", env) == OtlpSettings(traces_endpoint="http://tempo:4318/v1/traces")
    assert otlp_settings(BASE, {"OTEL_METRICS_EXPORTER": "none"}) == OtlpSettings(
        traces_endpoint=BASE + "/v1/traces"
    )
    assert otlp_settings(BASE, {"OTEL_TRACES_EXPORTER": "none"}) == OtlpSettings(
        metrics_endpoint=BASE + "/v1/metrics"
    )
    assert otlp_settings(BASE, {"OTEL_SDK_DISABLED": "true"}) == OtlpSettings()


@pytest.mark.parametrize(
    ("endpoint", "env", "key"),
    [
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (BASE, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        (BASE, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
         "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
        (BASE, {"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ],
)  # fmt: skip
def test_bad_settings_name_the_key(endpoint, env, key):
    with pytest.raises(OtelConfigError, match=key):
        otlp_settings(endpoint, env)


def test_export_timeout():
    assert export_timeout_s({}, "traces") is None
    assert export_timeout_s({"OTEL_EXPORTER_OTLP_TIMEOUT": "2.5"}, "traces") == 2.5
    env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "2.5", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "1"}
    assert export_timeout_s(env, "metrics") == 1.0
    with pytest.raises(OtelConfigError, match="OTEL_EXPORTER_OTLP_TIMEOUT"):
        export_timeout_s({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "traces")


def test_service_name_defaults_to_tokenstamp_unless_the_environment_names_one(monkeypatch):
    # The SDK reads the process environment itself: set it as an operator would.
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    attrs = resource({}).attributes
    assert attrs["service.name"] == "tokenstamp"
    assert attrs["service.version"]
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway")
    assert resource({"OTEL_SERVICE_NAME": "gateway"}).attributes["service.name"] == "gateway"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    given = {"OTEL_RESOURCE_ATTRIBUTES": "service.name=edge,service.version=9"}
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", given["OTEL_RESOURCE_ATTRIBUTES"])
    attrs = resource(given).attributes
    assert (attrs["service.name"], attrs["service.version"]) == ("edge", "9")


def test_serve_flags():
    cfg = config_from_argv(["--upstream", "http://u:1", "--otlp-endpoint", BASE,
                            "--capture-content", "true"], env={})  # fmt: skip
    assert cfg.otlp_endpoint == BASE
    assert cfg.capture_content is True
    cfg = config_from_argv(
        ["--upstream", "http://u:1"],
        env={"TOKENSTAMP_OTLP_ENDPOINT": BASE, "TOKENSTAMP_CAPTURE_CONTENT": "false"},
    )
    assert (cfg.otlp_endpoint, cfg.capture_content) == (BASE, False)
    assert config_from_argv(["--upstream", "http://u:1"], env={}).capture_content is False
    with pytest.raises(ConfigError, match="--otlp-endpoint"):
        config_from_argv(["--upstream", "http://u:1", "--otlp-endpoint", "4318"], env={})


def test_export_log_lines_are_rate_limited_and_counted(caplog):
    now = [0.0]
    health = ExportHealth()
    health.count("traces")
    filt = RateLimitFilter(health, every_s=60.0, clock=lambda: now[0])
    logger = logging.getLogger("tokenstamp.test.otlp")
    logger.addFilter(filt)
    try:
        with caplog.at_level(logging.WARNING, logger="tokenstamp.test.otlp"):
            for i in range(5):
                logger.error("Failed to export spans batch %d", i)
                now[0] += 10.0
            now[0] += 60.0
            logger.error("Failed to export spans batch %d", 99)
    finally:
        logger.removeFilter(filt)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("Failed to export spans batch 0 [tokenstamp: 1 span and 0 metric")
    assert messages[1].startswith("Failed to export spans batch 99")
    assert filt.suppressed == 4


def test_histogram_flag():
    cfg = config_from_argv(["--upstream", "http://u:1"], env={})
    assert cfg.otlp_histograms is HistogramAggregation.EXPONENTIAL
    cfg = config_from_argv(["--upstream", "http://u:1", "--otlp-histograms", "Explicit"], env={})
    assert cfg.otlp_histograms is HistogramAggregation.EXPLICIT
    env = {"TOKENSTAMP_OTLP_HISTOGRAMS": "explicit"}
    assert config_from_argv(["--upstream", "http://u:1"], env=env).otlp_histograms == "explicit"
    with pytest.raises(ConfigError, match="--otlp-histograms: expected exponential or explicit"):
        config_from_argv(["--upstream", "http://u:1", "--otlp-histograms", "native"], env={})


@pytest.mark.parametrize("aggregation", list(HistogramAggregation))
def test_every_histogram_gets_the_chosen_aggregation(aggregation):
    """Whatever the exporter prefers (OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION)."""
    prefer_other = ExponentialBucketHistogramAggregation()
    if aggregation is HistogramAggregation.EXPONENTIAL:
        prefer_other = ExplicitBucketHistogramAggregation()
    reader = InMemoryMetricReader(preferred_aggregation={SdkHistogram: prefer_other})
    provider = MeterProvider(metric_readers=[reader], views=histogram_views(aggregation))
    meter = provider.get_meter(METER_NAME, "1")
    histograms = [i for i in names.ALL if i.kind is names.Kind.HISTOGRAM]
    for inst in histograms:
        histogram(meter, inst).record(0.3, {"k": "v"})
    data = reader.get_metrics_data()
    assert data is not None
    got = {m.name: m.data for rm in data.resource_metrics for sm in rm.scope_metrics
           for m in sm.metrics}  # fmt: skip
    assert set(got) == {i.name for i in histograms}
    for inst in histograms:
        (point,) = got[inst.name].data_points
        if aggregation is HistogramAggregation.EXPONENTIAL:
            assert isinstance(got[inst.name], ExponentialHistogram), inst.name
            assert point.scale == names.EXPONENTIAL_MAX_SCALE
        else:
            assert isinstance(got[inst.name], ExplicitHistogram), inst.name
            assert tuple(point.explicit_bounds) == inst.buckets
    provider.shutdown()


@pytest.mark.parametrize("aggregation", list(HistogramAggregation))
def test_telemetry_bridges_the_gaps_with_the_same_aggregation(aggregation):
    telemetry = Telemetry(OtlpSettings(metrics_endpoint=BASE + "/v1/metrics"), {}, aggregation)
    try:
        assert telemetry.histograms is aggregation
        assert telemetry.gaps.aggregation is aggregation
    finally:
        assert telemetry.meter_provider is not None
        telemetry.meter_provider.shutdown()
