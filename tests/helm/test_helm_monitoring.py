"""PodMonitor, ServiceMonitor, PrometheusRule and dashboard ConfigMaps of the chart."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

PROMTOOL = shutil.which("promtool")

#: A rule file in the shape dashboards/ writes: a recording rule, an alert with a
#: multi-line expression, templated annotations and a quoted label.
SAMPLE_RULES = """\
groups:
  - name: tokenstamp-sample.rules
    rules:
      - record: server_address:tokenstamp_stalls:rate5m
        expr: sum by (server_address, tokenstamp_stall_cause) (rate(tokenstamp_stalls_total[5m]))
      - alert: TokenstampPrefillStutter
        expr: |
          sum by (server_address) (rate(tokenstamp_prefill_stutter_cost_seconds_total[5m]))
            > 0.5
        for: 10m
        labels:
          severity: warning
          tier: "1"
        annotations:
          summary: "Prefills freeze other streams on {{ $labels.server_address }}"
          description: "{{ $value | humanize }} user-seconds per second of frozen output."
          runbook_url: https://example.invalid/runbook.md#tokenstampprefillstutter
"""
#: A second file: its groups follow the first file's (file-name order).
SAMPLE_RULES_2 = """\
groups:
  - name: tokenstamp-sample-2.rules
    rules:
      - alert: TokenstampDecoderErrors
        expr: sum by (server_address) (rate(tokenstamp_decoder_errors_total[5m])) > 0
        for: 15m
        labels:
          severity: info
        annotations:
          summary: Undecodable upstream events
          description: The proxy skips events it cannot decode; bytes still flow.
          runbook_url: https://example.invalid/runbook.md#tokenstampdecodererrors
"""


def _dashboard(title: str) -> str:
    panel = {"type": "timeseries", "title": "TTFT p99 — prefill", "targets": [{"expr": "1"}]}
    document = {"title": title, "uid": title.lower(), "schemaVersion": 39, "panels": [panel]}
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _promtool_check(tmp_path: Path, rule: dict[str, Any]) -> None:
    """`promtool check rules` on the PrometheusRule's groups."""
    assert PROMTOOL, "promtool is required (Debian package prometheus)"
    rules_file = tmp_path / "prometheusrule-groups.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8")
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _emptied(directory: Path) -> Path:
    """``directory`` created, without the files the repository's chart holds."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def _all_on(harness) -> dict[str, Any]:
    values: dict[str, Any] = harness.load_values(harness.scenarios["everything-on"])
    return values


@pytest.mark.parametrize("name", ["everything-on", "sidecar-vllm"])
def test_monitoring_objects_need_the_operator_api(harness, name):
    values = harness.load_values(harness.scenarios[name])
    without = harness.render(values)
    assert [o for o in without.objects if o["apiVersion"] == harness.monitoring_api] == []
    monitor = "ServiceMonitor" if name == "everything-on" else "PodMonitor"
    assert f"{monitor[0].lower()}{monitor[1:]}.enabled, but this cluster has no" in without.notes
    with_api = harness.render(values, api_versions=(harness.monitoring_api,))
    assert with_api.one(monitor)["apiVersion"] == harness.monitoring_api
    assert f"{monitor} {with_api.one(monitor)['metadata']['name']} scrapes" in with_api.notes


def test_monitors_are_off_by_default(harness):
    rendered = harness.render(
        {"config": {"upstream": "http://vllm:8000"}}, api_versions=(harness.monitoring_api,)
    )
    assert rendered.kinds() == ["Deployment", "Pod", "Service", "ServiceAccount"]
    assert "Nothing scrapes /metrics yet" in rendered.notes


def test_service_monitor_scrapes_the_admin_port(harness):
    rendered = harness.render(_all_on(harness), api_versions=(harness.monitoring_api,))
    monitor = rendered.one("ServiceMonitor")
    service = rendered.one("Service")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {
        "matchNames": [service["metadata"]["namespace"]]
    }
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("admin", "/metrics")
    assert any(p["name"] == "admin" for p in service["spec"]["ports"])
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    # The chart's rules and dashboards select job="tokenstamp"; the user's relabelings follow.
    assert endpoint["relabelings"][0] == {"targetLabel": "job", "replacement": "tokenstamp"}
    assert endpoint["relabelings"][1]["targetLabel"] == "node"


@pytest.mark.parametrize("kind", ["serviceMonitor", "podMonitor"])
def test_monitors_can_ask_for_native_histograms(harness, kind):
    """Protobuf first and the classic series kept: fields of the monitor's spec (the
    `native-histograms` feature itself is the Prometheus resource's `enableFeatures`)."""
    base = (
        {"mode": "sidecar"} if kind == "podMonitor" else {"config": {"upstream": "http://v:8000"}}
    )
    name = kind[0].upper() + kind[1:]
    plain = harness.render(
        {**base, kind: {"enabled": True}}, api_versions=(harness.monitoring_api,)
    )
    spec = plain.one(name)["spec"]
    assert "scrapeProtocols" not in spec
    assert "scrapeClassicHistograms" not in spec
    protocols = ["PrometheusProto", "OpenMetricsText1.0.0", "PrometheusText0.0.4"]
    values = {
        kind: {"enabled": True, "scrapeProtocols": protocols, "scrapeClassicHistograms": True}
    }
    rendered = harness.render({**base, **values}, api_versions=(harness.monitoring_api,))
    monitor = rendered.one(name)
    assert monitor["spec"]["scrapeProtocols"] == protocols
    assert monitor["spec"]["scrapeClassicHistograms"] is True
    harness.validate(monitor)
    off = {kind: {"enabled": True, "scrapeClassicHistograms": False}}
    spec = harness.render({**base, **off}, api_versions=(harness.monitoring_api,)).one(name)["spec"]
    assert spec["scrapeClassicHistograms"] is False


def test_job_label_is_what_the_rules_select(harness):
    """Every `job` matcher in the chart's rules names the job the monitors set."""
    defaults = harness.load_values(harness.chart_dir / "values.yaml")
    job = defaults["podMonitor"]["job"]
    assert defaults["serviceMonitor"]["job"] == job
    texts = [f.read_text(encoding="utf-8") for f in harness.chart_dir.glob("files/rules/*.yaml")]
    matchers = {m for text in texts for m in re.findall(r'job="([^"]*)"', text)}
    assert matchers <= {job}


def test_pod_monitor_selects_the_pods(harness):
    values = harness.load_values(harness.scenarios["sidecar-vllm"])
    rendered = harness.render(values, api_versions=(harness.monitoring_api,))
    monitor = rendered.one("PodMonitor")
    pod_labels = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("admin", "/metrics")
    assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": "tokenstamp"}]


def test_pod_monitor_selector_can_be_overridden(harness):
    values = {
        "mode": "sidecar",
        "podMonitor": {"enabled": True, "selector": {"app.kubernetes.io/name": "my-vllm"}},
    }
    rendered = harness.render(values, api_versions=(harness.monitoring_api,))
    assert rendered.kinds() == ["PodMonitor"]
    monitor = rendered.one("PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "my-vllm"}
    harness.validate(monitor)


def test_prometheus_rule_carries_the_charts_rules(harness, tmp_path):
    """With the rule files the chart holds now: every group, in order, and promtool agrees."""
    files = sorted(harness.chart_dir.glob("files/rules/*.yaml"))
    rendered = harness.render(_all_on(harness), api_versions=(harness.monitoring_api,))
    if not files:
        assert rendered.all("PrometheusRule") == []
        assert "carries no rules: nothing was rendered" in rendered.notes
        return
    groups = [g for f in files for g in yaml.safe_load(f.read_text(encoding="utf-8"))["groups"]]
    rule = rendered.one("PrometheusRule")
    # Every alert's runbook link points at the configured runbook, its own section.
    base = _all_on(harness)["prometheusRule"]["runbookUrl"]
    assert base.startswith("https://")
    links = 0
    for group in groups:
        for r in group["rules"]:
            url = r.get("annotations", {}).get("runbook_url")
            if url is not None:
                assert url == f"dashboards/runbook.md#{r['alert'].lower()}"
                r["annotations"]["runbook_url"] = f"{base}#{r['alert'].lower()}"
                links += 1
    assert links == sum(1 for g in groups for r in g["rules"] if "alert" in r)
    assert rule["spec"]["groups"] == groups
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    harness.validate(rule)
    _promtool_check(tmp_path, rule)


def test_prometheus_rule_from_rule_files(load_harness, chart_copy, tmp_path):
    """The template's mechanics, on rule files written into a scratch copy of the chart."""
    rules_dir = _emptied(chart_copy / "files" / "rules")
    (rules_dir / "a-sample.yaml").write_text(SAMPLE_RULES, encoding="utf-8")
    (rules_dir / "b-sample.yaml").write_text(SAMPLE_RULES_2, encoding="utf-8")
    copy = load_harness(chart_copy)
    values = copy.load_values(copy.scenarios["everything-on"])
    assert copy.render(values).all("PrometheusRule") == []
    rendered = copy.render(values, api_versions=(copy.monitoring_api,))
    rule = rendered.one("PrometheusRule")
    expected = yaml.safe_load(SAMPLE_RULES)["groups"] + yaml.safe_load(SAMPLE_RULES_2)["groups"]
    assert rule["spec"]["groups"] == expected
    assert rule["metadata"]["namespace"] == "monitoring"
    copy.validate(rule)
    _promtool_check(tmp_path, rule)
    assert "carries tokenstamp's recording and alerting rules" in rendered.notes


def test_prometheus_rule_rejects_a_broken_rule_file(load_harness, chart_copy):
    rules_dir = _emptied(chart_copy / "files" / "rules")
    (rules_dir / "broken.yaml").write_text("groups: [unclosed\n", encoding="utf-8")
    copy = load_harness(chart_copy)
    with pytest.raises(Exception, match=re.escape("files/rules/broken.yaml is not valid YAML")):
        copy.render({"config": {"upstream": "http://vllm:8000"}})


def test_dashboard_configmaps_equal_the_dashboards(harness, sync_script):
    """Every dashboard of dashboards/ reaches Grafana byte for byte (none yet: none rendered)."""
    source = harness.repo_root / "dashboards"
    copies = [
        c
        for c in sync_script.planned_copies(source, harness.chart_dir)
        if c.source.suffix == ".json"
    ]
    rendered = harness.render(_all_on(harness))
    maps = rendered.all("ConfigMap")
    data = {key: text for m in maps for key, text in m["data"].items()}
    assert data == {c.source.name: c.source.read_text(encoding="utf-8") for c in copies}
    if not copies:
        assert "carries no dashboards: nothing was rendered" in rendered.notes


def test_dashboard_configmaps_from_dashboard_files(load_harness, chart_copy):
    """The template's mechanics, on dashboards written into a scratch copy of the chart."""
    dashboards_dir = _emptied(chart_copy / "files" / "dashboards")
    texts = {
        "serving-latency.json": _dashboard("Serving latency"),
        "prefill_stutter.json": _dashboard("Prefill stutter"),
    }
    for name, text in texts.items():
        (dashboards_dir / name).write_text(text, encoding="utf-8")
    copy = load_harness(chart_copy)
    values = copy.load_values(copy.scenarios["everything-on"])
    rendered = copy.render(values)
    maps = {m["metadata"]["name"]: m for m in rendered.all("ConfigMap")}
    assert sorted(maps) == [
        "tokenstamp-all-on-dashboard-prefill-stutter",
        "tokenstamp-all-on-dashboard-serving-latency",
    ]
    for config_map in maps.values():
        copy.validate(config_map)
        meta = config_map["metadata"]
        assert meta["labels"]["grafana_dashboard"] == "1"
        assert meta["labels"]["release"] == "kube-prometheus-stack"
        assert meta["annotations"]["grafana_folder"] == "LLM serving"
        assert meta["namespace"] == "monitoring"
    data = {key: text for m in maps.values() for key, text in m["data"].items()}
    assert data == texts
    assert "2 Grafana dashboard ConfigMap(s)" in rendered.notes
    off = copy.render({**values, "dashboards": {"enabled": False}})
    assert off.all("ConfigMap") == []
