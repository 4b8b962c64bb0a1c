"""OTLP settings from flags and ``OTEL_*``; the rate-limited export log; the serve flags."""

from __future__ import annotations

import logging

import pytest

from exporters.otel_setup import (
    ExportHealth,
    OtelConfigError,
    OtlpSettings,
    RateLimitFilter,
    export_timeout_s,
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
