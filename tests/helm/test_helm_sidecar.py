"""Sidecar mode: the chart's own vLLM example, and another chart including tokenstamp's templates."""

from __future__ import annotations

import shutil
from typing import Any

import helm_python
import pytest


def _containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def _flag(container: dict[str, Any], name: str) -> str:
    args: list[str] = container["args"]
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}="))


def test_vllm_example_runs_vllm_beside_tokenstamp(harness):
    values = harness.load_values(harness.scenarios["sidecar-vllm"])
    rendered = harness.render(values, api_versions=(harness.monitoring_api,))
    deployment = rendered.one("Deployment")
    pod_spec = deployment["spec"]["template"]["spec"]
    containers = _containers(deployment)
    assert list(containers) == ["vllm", "tokenstamp"]
    vllm, proxy = containers["vllm"], containers["tokenstamp"]
    vllm_port = next(p["containerPort"] for p in vllm["ports"])
    assert _flag(proxy, "upstream") == f"http://127.0.0.1:{vllm_port}"
    assert f"--port={vllm_port}" in vllm["args"]
    assert _flag(proxy, "provider") == "vllm"
    # vLLM's image runs as root: the pod context must not forbid it; tokenstamp stays hardened.
    assert "runAsNonRoot" not in pod_spec["securityContext"]
    assert proxy["securityContext"]["runAsNonRoot"] is True
    volumes = {v["name"] for v in pod_spec["volumes"]}
    mounts = {m["name"] for c in containers.values() for m in c["volumeMounts"]}
    assert mounts <= volumes
    assert "tokenstamp-tmp" in volumes
    # vLLM keeps serving (preStop sleep) while the proxy drains, inside the grace period.
    sleep_s = int(vllm["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert (
        float(_flag(proxy, "drain-timeout")) <= sleep_s < pod_spec["terminationGracePeriodSeconds"]
    )
    # Clients reach vLLM only through the proxy.
    service = rendered.one("Service")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"proxy", "admin"}


def test_sidecar_without_model_server_renders_no_workload(harness):
    rendered = harness.render({"mode": "sidecar"})
    assert rendered.objects == []
    assert 'include "tokenstamp.container" .Subcharts.tokenstamp' in rendered.notes


def test_model_server_ports_must_not_collide_with_tokenstamps(harness):
    with pytest.raises(helm_python.HelmRenderError, match="collides"):
        harness.render(
            {
                "mode": "sidecar",
                "sidecar": {
                    "modelServer": {
                        "name": "vllm",
                        "image": "vllm/vllm-openai:v0.8.5",
                        "ports": [{"name": "http", "containerPort": 9464}],
                    }
                },
            }
        )


def test_parent_chart_includes_tokenstamp_beside_vllm(harness, load_harness, tmp_path):
    """helm/examples/vllm-with-tokenstamp: a chart of one's own with tokenstamp as a dependency."""
    helm_dir = tmp_path / "helm"
    shutil.copytree(harness.chart_dir, helm_dir / "tokenstamp")
    parent_dir = helm_dir / "examples" / "vllm-with-tokenstamp"
    shutil.copytree(harness.repo_root / "helm" / "examples" / "vllm-with-tokenstamp", parent_dir)
    helm_python.dependency_update(parent_dir)
    report = helm_python.lint(
        parent_dir, None, strict=True, kube_version=f"v{harness.kube_version}"
    )
    assert [m for m in report["messages"] if m["severity"] >= 2] == []

    parent = load_harness(parent_dir)
    rendered = parent.render(None, api_versions=(harness.monitoring_api,))
    for obj in rendered.objects:
        harness.validate(obj)
    assert rendered.kinds() == ["Deployment", "PodMonitor", "Service"]
    deployment = rendered.one("Deployment")
    pod_spec = deployment["spec"]["template"]["spec"]
    containers = _containers(deployment)
    assert list(containers) == ["vllm", "tokenstamp"]
    proxy = containers["tokenstamp"]
    vllm_port = containers["vllm"]["ports"][0]["containerPort"]
    assert _flag(proxy, "upstream") == f"http://127.0.0.1:{vllm_port}"
    assert {v["name"] for v in pod_spec["volumes"]} == {"dshm", "tokenstamp-tmp"}
    assert pod_spec["terminationGracePeriodSeconds"] > float(_flag(proxy, "drain-timeout"))
    service = rendered.one("Service")
    proxy_ports = {p["name"] for p in proxy["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= proxy_ports
    monitor = rendered.one("PodMonitor")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
