"""Lint and render every ci/ scenario of the chart; validate every manifest; check conventions."""

from __future__ import annotations

import re
from typing import Any

import pytest

#: Labels the prometheus-community guidelines put on every object.
RECOMMENDED_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
}
#: The only labels a selector may use: stable across upgrades.
SELECTOR_LABELS = {"app.kubernetes.io/name", "app.kubernetes.io/instance"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _expected_kinds(harness, name: str) -> list[str]:
    """Kinds each scenario must render, given the rules and dashboards the chart carries."""
    dashboards = len(list(harness.chart_dir.glob("files/dashboards/*.json")))
    rules = ["PrometheusRule"] if list(harness.chart_dir.glob("files/rules/*.yaml")) else []
    kinds = {
        "standalone": ["Deployment", "Pod", "Service", "ServiceAccount"],
        "sidecar-vllm": [
            "Deployment",
            "Pod",
            "PodMonitor",
            "Service",
            "ServiceAccount",
            *rules,
            *["ConfigMap"] * dashboards,
        ],
        "everything-on": [
            "Deployment",
            "Pod",
            "Service",
            "ServiceAccount",
            "ServiceMonitor",
            *rules,
            *["ConfigMap"] * dashboards,
        ],
        "everything-off": ["Deployment"],
    }
    return sorted(kinds[name])


def _tokenstamp_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod_spec["containers"] if c["name"] == "tokenstamp")


def _flag(container: dict[str, Any], name: str) -> str:
    """Value of the last ``--name=value`` argument (the proxy's argparse keeps the last)."""
    values: list[str] = [
        a.split("=", 1)[1] for a in container["args"] if a.startswith(f"--{name}=")
    ]
    assert values, f"--{name} not passed: {container['args']}"
    return values[-1]


def test_every_scenario_has_a_values_file(harness):
    assert set(harness.scenarios) == {
        "standalone",
        "sidecar-vllm",
        "everything-on",
        "everything-off",
    }


def test_lint_strict_is_clean(harness, scenario):
    _, values = scenario
    messages = harness.lint(values)
    problems = [m for m in messages if m["severity"] >= 2]
    assert not problems, problems
    # The one piece of advice left: there is no icon to point at yet.
    assert {m["error"] for m in messages} <= {"icon is recommended"}


def test_every_manifest_validates_strictly(harness, scenario):
    name, values = scenario
    rendered = harness.render(values, api_versions=(harness.monitoring_api,))
    assert rendered.kinds() == _expected_kinds(harness, name)
    for obj in rendered.objects:
        harness.validate(obj)


def test_objects_carry_recommended_labels_and_namespace(harness, scenario):
    _, values = scenario
    rendered = harness.render(values, api_versions=(harness.monitoring_api,))
    for obj in rendered.objects:
        meta = obj["metadata"]
        assert set(meta["labels"]) >= RECOMMENDED_LABELS, meta["name"]
        assert meta["labels"]["app.kubernetes.io/instance"] == harness.release
        assert meta.get("namespace"), f"{obj['kind']} {meta['name']} has no namespace"
        assert len(meta["name"]) <= 63
        assert DNS_LABEL.match(meta["name"]), meta["name"]


def test_selectors_use_only_stable_labels(harness, scenario):
    _, values = scenario
    rendered = harness.render(values, api_versions=(harness.monitoring_api,))
    deployment = rendered.one("Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert set(selector) == SELECTOR_LABELS
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    others = [s["spec"]["selector"] for s in rendered.all("Service")]
    others += [m["spec"]["selector"]["matchLabels"] for m in rendered.all("ServiceMonitor")]
    others += [m["spec"]["selector"]["matchLabels"] for m in rendered.all("PodMonitor")]
    for other in others:
        assert other == selector


def test_service_targets_named_container_ports(harness, scenario):
    _, values = scenario
    rendered = harness.render(values)
    for service in rendered.all("Service"):
        pod_spec = rendered.one("Deployment")["spec"]["template"]["spec"]
        port_names = {p["name"] for p in _tokenstamp_container(pod_spec)["ports"]}
        targets = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
        assert targets == {"http": "proxy", "admin": "admin"}
        assert set(targets.values()) <= port_names


def test_tokenstamp_container_is_hardened(harness, scenario):
    _, values = scenario
    rendered = harness.render(values)
    pod_spec = rendered.one("Deployment")["spec"]["template"]["spec"]
    context = _tokenstamp_container(pod_spec)["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] > 0
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_spec["automountServiceAccountToken"] is False


def test_resources_are_empty_by_default(harness):
    rendered = harness.render({"config": {"upstream": "http://vllm:8000"}})
    pod_spec = rendered.one("Deployment")["spec"]["template"]["spec"]
    assert _tokenstamp_container(pod_spec)["resources"] == {}


def test_probes_and_ports_follow_the_admin_port(harness, scenario):
    _, values = scenario
    rendered = harness.render(values)
    container = _tokenstamp_container(rendered.one("Deployment")["spec"]["template"]["spec"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert _flag(container, "admin") == f"0.0.0.0:{ports['admin']}"
    assert _flag(container, "listen") == f"0.0.0.0:{ports['proxy']}"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}


def test_grace_period_exceeds_drain_timeout(harness, scenario):
    _, values = scenario
    rendered = harness.render(values)
    pod_spec = rendered.one("Deployment")["spec"]["template"]["spec"]
    drain_s = float(_flag(_tokenstamp_container(pod_spec), "drain-timeout"))
    assert pod_spec["terminationGracePeriodSeconds"] > drain_s


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, "ci-tokenstamp"),
        ({"nameOverride": "proxy"}, "ci-proxy"),
        ({"fullnameOverride": "x" * 80}, "x" * 63),
        ({"fullnameOverride": "y" * 62 + "-z"}, "y" * 62),
    ],
)
def test_fullname_is_truncated_to_63(harness, overrides, expected):
    values = {"config": {"upstream": "http://vllm:8000"}, **overrides}
    rendered = harness.render(values)
    assert rendered.one("Deployment")["metadata"]["name"] == expected


def test_long_release_name_is_truncated(harness):
    release = "r" * 53
    rendered = harness.render({"config": {"upstream": "http://vllm:8000"}}, release=release)
    for obj in rendered.objects:
        assert len(obj["metadata"]["name"]) <= 63
        assert DNS_LABEL.match(obj["metadata"]["name"])
    assert rendered.one("Deployment")["metadata"]["name"] == (release + "-tokenstamp")[:63]


def test_release_named_after_chart_is_not_doubled(harness):
    rendered = harness.render({"config": {"upstream": "http://vllm:8000"}}, release="tokenstamp")
    assert rendered.one("Deployment")["metadata"]["name"] == "tokenstamp"


def test_test_hook_calls_readyz_and_metrics_through_the_service(harness, scenario):
    _, values = scenario
    rendered = harness.render(values)
    hooks = [p for p in rendered.all("Pod") if p["metadata"]["annotations"]["helm.sh/hook"]]
    if not rendered.all("Service"):
        assert hooks == []
        return
    (hook,) = hooks
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = rendered.one("Service")
    admin_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "admin")
    namespace = service["metadata"]["namespace"]
    (container,) = hook["spec"]["containers"]
    python, dash_c, script, url = container["command"]
    assert (python, dash_c) == ("python", "-c")
    assert url == f"http://{service['metadata']['name']}.{namespace}.svc:{admin_port}"
    assert '"/readyz"' in script
    assert '"/metrics"' in script
    compile(script, "hook", "exec")
    assert (
        container["image"]
        == _tokenstamp_container(rendered.one("Deployment")["spec"]["template"]["spec"])["image"]
    )
    assert hook["spec"]["restartPolicy"] == "Never"


def test_notes_point_at_the_rendered_service(harness, scenario):
    _, values = scenario
    rendered = harness.render(values)
    notes = rendered.notes
    assert f"({values.get('mode', 'standalone')} mode)" in notes
    for service in rendered.all("Service"):
        name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
        ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        assert f"http://{name}.{namespace}.svc:{ports['http']}" in notes
        assert f"port-forward svc/{name} {ports['http']} {ports['admin']}" in notes
        assert f"curl -s localhost:{ports['admin']}/readyz" in notes
    pod_spec = rendered.one("Deployment")["spec"]["template"]["spec"]
    grace = pod_spec["terminationGracePeriodSeconds"]
    assert f"terminationGracePeriodSeconds: {grace} s" in notes
    assert f"forwards to {_flag(_tokenstamp_container(pod_spec), 'upstream')}" in notes
