"""values.yaml, values.schema.json and the proxy flags they reach."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import helm_python
import pytest

from proxy.cli import build_parser
from proxy.config import HostPort, config_from_argv

#: `tokenstamp serve`'s flags, by the config key that reaches each. `--listen` and
#: `--admin` come from `ports`; `--no-inject-usage` is `--inject-usage=false`.
CONFIG_FLAGS = {
    "upstream": "upstream",
    "backendName": "backend-name",
    "provider": "provider",
    "maxBodyBytes": "max-body-bytes",
    "bodyBudget": "body-budget",
    "maxEventBytes": "max-event-bytes",
    "connectTimeout": "connect-timeout",
    "readTimeout": "read-timeout",
    "modelLabelLimit": "model-label-limit",
    "modelAllowlist": "model-allowlist",
    "injectUsage": "inject-usage",
    "sloTtft": "slo-ttft",
    "sloTpot": "slo-tpot",
    "sloAnswerTtft": "slo-answer-ttft",
    "sloTtftHeader": "slo-ttft-header",
    "sloTpotHeader": "slo-tpot-header",
    "tenantHeader": "tenant-header",
    "tenantAllow": "tenant-allow",
    "maxTenants": "max-tenants",
    "drainTimeout": "drain-timeout",
    "drainDelay": "drain-delay",
    "headerTimeout": "header-timeout",
    "bodyTimeout": "body-timeout",
    "maxStreamDuration": "max-stream-duration",
    "logLevel": "log-level",
    "loop": "loop",
    "stallRatio": "stall-ratio",
    "stallFloor": "stall-floor",
    "stallTolerance": "stall-tolerance",
    "observe": "observe",
    "stallDetection": "stall-detection",
    "heapTrim": "heap-trim",
    "otlpEndpoint": "otlp-endpoint",
    "otlpHistograms": "otlp-histograms",
    "captureContent": "capture-content",
    "nativeHistograms": "native-histograms",
    "timeline": "timeline",
    "timelineWindow": "timeline-window",
    "advisor": "advisor",
    "trustForwarded": "trust-forwarded",
}
UPSTREAM = {"upstream": "http://vllm.inference.svc:8000"}
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+):(?: |$)")


def _args(harness, values: dict[str, Any]) -> list[str]:
    rendered = harness.render(values)
    containers = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"]
    args: list[str] = next(c for c in containers if c["name"] == "tokenstamp")["args"]
    return args


def _env(harness, values: dict[str, Any]) -> dict[str, Any]:
    rendered = harness.render(values)
    containers = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"]
    env = next(c for c in containers if c["name"] == "tokenstamp")["env"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in env}


def _schema_paths(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every key path the schema declares with `properties`."""
    paths: set[tuple[str, ...]] = set()
    for key, sub in schema.get("properties", {}).items():
        paths.add((*prefix, key))
        paths |= _schema_paths(sub, (*prefix, key))
    return paths


def test_every_declared_value_is_commented(harness):
    """Each key the schema declares has a comment right above it in values.yaml."""
    schema = json.loads((harness.chart_dir / "values.schema.json").read_text(encoding="utf-8"))
    declared = _schema_paths(schema)
    lines = (harness.chart_dir / "values.yaml").read_text(encoding="utf-8").splitlines()
    stack: list[tuple[int, str]] = []
    seen: set[tuple[str, ...]] = set()
    uncommented = []
    for number, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if not match or line.lstrip().startswith("#"):
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        path = tuple(key for _, key in stack)
        if path not in declared:
            continue
        seen.add(path)
        above = lines[number - 1].strip() if number else ""
        if not above.startswith("#"):
            uncommented.append(".".join(path))
    assert uncommented == []
    assert seen == {p for p in declared if p != ("global",)}


def test_defaults_meet_the_schema_and_the_schema_rejects_unknown_keys(harness):
    harness.chart.validate_schema(None)
    for bad in (
        {"bogus": 1},
        {"config": {"sloTTFT": 0.5}},
        {"mode": "daemonset"},
        {"config": {"maxBodyBytes": "ten"}},
        {"podMonitor": {"enabled": "yes"}},
        {"image": {"digest": "latest"}},
        {"config": {"tenantHeader": ["Authorization"]}},  # a credential is never a label
        {"config": {"tenantHeader": ["x tenant"]}},
    ):
        with pytest.raises(helm_python.HelmValuesError):
            harness.chart.validate_schema(bad)


def test_config_keys_are_the_cli_flags(harness):
    defaults = harness.load_values(harness.chart_dir / "values.yaml")
    assert set(defaults["config"]) == set(CONFIG_FLAGS)


def test_every_proxy_flag_is_reachable_from_values():
    """Each flag of the real `tokenstamp serve` parser has its config key (and no key is extra)."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    flags = {o[2:] for a in serve._actions for o in a.option_strings if o.startswith("--")}
    from_values = set(CONFIG_FLAGS.values()) | {
        "listen",
        "admin",
        "no-inject-usage",
        "no-observe",
        "no-stall-detection",
        "no-heap-trim",
        "no-capture-content",
        "no-native-histograms",
        "no-timeline",
        "no-advisor",
        "no-trust-forwarded",
        "help",
    }
    assert flags == from_values, (
        "a `tokenstamp serve` flag and the chart's `config` values disagree: add or remove the "
        "key in helm/tokenstamp/values.yaml, values.schema.json, ci/everything-on-values.yaml "
        "and CONFIG_FLAGS here"
    )


def test_everything_on_passes_every_flag(harness):
    values = harness.load_values(harness.scenarios["everything-on"])
    assert set(values["config"]) == set(CONFIG_FLAGS)
    args = _args(harness, {**values, "extraArgs": []})
    flags = {a.removeprefix("--").split("=", 1)[0] for a in args}
    assert flags == set(CONFIG_FLAGS.values()) | {"listen", "admin"}


def test_rendered_args_are_a_valid_proxy_config(harness, scenario):
    """The proxy's own flag parsing and validation accept what every scenario renders."""
    _, values = scenario
    args = _args(harness, values)
    config = config_from_argv(args, env={})
    ports = {"proxy": 8080, "admin": 9464, **values.get("ports", {})}
    assert config.listen == HostPort("0.0.0.0", ports["proxy"])
    assert config.admin == HostPort("0.0.0.0", ports["admin"])
    assert config.upstream == values["config"].get("upstream", "http://127.0.0.1:8000")
    assert config.drain_timeout_s == values["config"].get("drainTimeout", 30)


@pytest.mark.parametrize(
    ("inject", "expected"),
    [(True, ["--inject-usage=true"]), (False, ["--inject-usage=false"]), (None, [])],
)
def test_inject_usage_has_three_states(harness, inject, expected):
    args = _args(harness, {"config": {**UPSTREAM, "injectUsage": inject}})
    assert [a for a in args if "inject-usage" in a] == expected
    if inject is not None:
        assert config_from_argv(args, env={}).inject_usage is inject


def test_unset_flags_are_left_to_the_proxy(harness):
    args = _args(harness, {"config": UPSTREAM})
    assert args == [
        "--upstream=http://vllm.inference.svc:8000",
        "--listen=0.0.0.0:8080",
        "--admin=0.0.0.0:9464",
        "--backend-name=ci-tokenstamp",
        "--drain-delay=5",  # the chart's own default: Services stop sending before the close
        "--drain-timeout=30",
    ]


def test_numbers_and_lists_render_as_the_cli_reads_them(harness):
    config = {
        **UPSTREAM,
        "maxBodyBytes": 10485760,
        "stallFloor": 0.05,
        "sloTtft": 1,
        "modelAllowlist": ["a/b", "c"],
    }
    args = _args(harness, {"config": config})
    assert "--max-body-bytes=10485760" in args
    assert "--stall-floor=0.05" in args
    assert "--slo-ttft=1" in args
    assert "--model-allowlist=a/b,c" in args


def test_extra_args_come_last(harness):
    args = _args(harness, {"config": UPSTREAM, "extraArgs": ["--log-level=debug"]})
    assert args[-1] == "--log-level=debug"


def test_otel_settings_become_standard_env(harness):
    values = harness.load_values(harness.scenarios["everything-on"])
    env = _env(harness, values)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_SERVICE_NAME"] == "tokenstamp-gateway"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    assert env["OTEL_METRIC_EXPORT_INTERVAL"] == "15000"
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == {
        "secretKeyRef": {"name": "otlp-auth", "key": "headers"}
    }
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == (
        "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),"
        "k8s.node.name=$(NODE_NAME),deployment.environment=staging"
    )
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_otlp_export_is_off_without_an_endpoint(harness):
    env = _env(harness, {"config": UPSTREAM})
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env
    assert env["OTEL_SERVICE_NAME"] == "ci-tokenstamp"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "config.upstream is required in standalone mode"),
        (
            {"config": {**UPSTREAM, "drainTimeout": 60}, "terminationGracePeriodSeconds": 60},
            "must be above config.drainTimeout",
        ),
        (
            {
                "config": UPSTREAM,
                "podMonitor": {"enabled": True},
                "serviceMonitor": {"enabled": True},
            },
            "choose one",
        ),
        ({"config": UPSTREAM, "ports": {"proxy": 9000, "admin": 9000}}, "must differ"),
        (
            {"config": UPSTREAM, "sidecar": {"modelServer": {"name": "vllm", "image": "v"}}},
            'mode is not "sidecar"',
        ),
        ({"mode": "sidecar", "sidecar": {"modelServer": {"image": "v"}}}, "name is required"),
        (
            {"mode": "sidecar", "sidecar": {"modelServer": {"name": "tokenstamp", "image": "v"}}},
            "must not be",
        ),
        (
            {
                "mode": "sidecar",
                "sidecar": {
                    "modelServer": {
                        "name": "vllm",
                        "image": "v",
                        "ports": [{"containerPort": 8080}],
                    }
                },
            },
            "collides",
        ),
        ({"mode": "sidecar", "serviceMonitor": {"enabled": True}}, "needs the chart's Service"),
        (
            {"config": UPSTREAM, "otel": {"headersSecret": {"name": "s", "key": ""}}},
            "otel.headersSecret.key is required",
        ),
    ],
)
def test_values_that_cannot_work_fail_naming_the_value(harness, values, message):
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        harness.render(values)


# The alert's own anchor is appended: a base with one would break every link, and a
# relative one is what the rules carry already.
@pytest.mark.parametrize("url", ["https://x/runbook.md#top", "runbook.md", "https://x/a b"])
def test_runbook_url_must_be_an_absolute_url_without_anchor(harness, url):
    values = {"config": UPSTREAM, "prometheusRule": {"runbookUrl": url}}
    with pytest.raises(helm_python.HelmValuesError, match="runbookUrl"):
        harness.render(values)


def test_grace_period_defaults_above_a_fractional_drain(harness):
    rendered = harness.render({"config": {**UPSTREAM, "drainTimeout": 12.5}})
    pod_spec = rendered.one("Deployment")["spec"]["template"]["spec"]
    assert pod_spec["terminationGracePeriodSeconds"] == 28
