"""Shared fixtures of the chart tests: render and lint helm/tokenstamp with Helm as a library.

Helm comes from ``helm-python-sdk`` (Helm v4's Go SDK behind a C ABI; no helm
binary, no cluster). Its public ``Chart.render`` does not expose
``--api-versions`` or ``--kube-version``, but the library's render options do
(``api_versions``, ``kube_version``), so ``ChartHarness.render`` passes them
through the SDK's native call. Manifests are checked with
``kubernetes-validate --strict``; the Prometheus Operator's kinds, which it has
no schema for, with the operator's generated pydantic models (cloudcoil) and a
round trip that must keep every field.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as operator_v1
from helm_python import _native
from kubernetes_validate import utils as kube_validate  # type: ignore[import-untyped]

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "tokenstamp"
#: Kubernetes version the chart is linted, rendered and validated against.
KUBE_VERSION = "1.32.0"
#: The Prometheus Operator's API, whose presence the monitoring templates check.
MONITORING_API = "monitoring.coreos.com/v1"
RELEASE = "ci"
NAMESPACE = "inference"

#: The value scenarios under ci/: name -> file.
SCENARIOS = {
    path.name.removesuffix("-values.yaml"): path
    for path in sorted(CHART_DIR.glob("ci/*-values.yaml"))
}


@dataclass
class Rendered:
    """One rendering of the chart: manifests by template, parsed."""

    files: dict[str, str]
    """Template path -> rendered text (NOTES.txt included)."""
    objects: list[dict[str, Any]] = field(default_factory=list)
    """Every Kubernetes object, in template order."""

    @property
    def notes(self) -> str:
        """The rendered NOTES.txt."""
        return next((text for name, text in self.files.items() if name.endswith("NOTES.txt")), "")

    def kinds(self) -> list[str]:
        """Kinds of the objects, sorted."""
        return sorted(obj["kind"] for obj in self.objects)

    def one(self, kind: str) -> dict[str, Any]:
        """The single object of ``kind``."""
        found = [obj for obj in self.objects if obj["kind"] == kind]
        assert len(found) == 1, f"expected one {kind}, got {len(found)}"
        return found[0]

    def all(self, kind: str) -> list[dict[str, Any]]:
        """Every object of ``kind``."""
        return [obj for obj in self.objects if obj["kind"] == kind]


def _subset(original: Any, dumped: Any, path: str = "") -> list[str]:
    """Where ``original`` is not contained in ``dumped`` (a model may add defaults, never drop)."""
    if isinstance(original, dict):
        if not isinstance(dumped, dict):
            return [f"{path}: {dumped!r} is not a mapping"]
        problems: list[str] = []
        for key, value in original.items():
            if key not in dumped:
                problems.append(f"{path}.{key}: unknown field")
            else:
                problems += _subset(value, dumped[key], f"{path}.{key}")
        return problems
    if isinstance(original, list):
        if not isinstance(dumped, list) or len(dumped) != len(original):
            return [f"{path}: list changed to {dumped!r}"]
        return [p for i, v in enumerate(original) for p in _subset(v, dumped[i], f"{path}[{i}]")]
    return [] if original == dumped else [f"{path}: {original!r} became {dumped!r}"]


def validate_object(obj: dict[str, Any]) -> None:
    """Validate one object strictly: core kinds by schema, operator kinds by model."""
    if obj["apiVersion"] == MONITORING_API:
        model = getattr(operator_v1, obj["kind"]).model_validate(obj)
        dumped = model.model_dump(mode="json", by_alias=True, exclude_none=True)
        problems = _subset(obj, dumped)
        assert not problems, f"{obj['kind']} {obj['metadata']['name']}: {problems}"
        return
    try:
        kube_validate.validate(obj, KUBE_VERSION, strict=True)
    except kube_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path)
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {where}: {error.message}")


def load_values(path: Path) -> dict[str, Any]:
    """A values file as a dict."""
    values: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return values


class ChartHarness:
    """Lint and render a chart directory with Helm as a library."""

    repo_root = REPO_ROOT
    kube_version = KUBE_VERSION
    monitoring_api = MONITORING_API
    release = RELEASE
    namespace = NAMESPACE
    scenarios = SCENARIOS
    validate = staticmethod(validate_object)
    load_values = staticmethod(load_values)

    def __init__(self, chart_dir: Path) -> None:
        """Load the chart at ``chart_dir``."""
        self.chart_dir = chart_dir
        self.chart = helm_python.Chart.load(chart_dir)

    def close(self) -> None:
        """Release the native chart handle."""
        self.chart.close()

    def render(
        self,
        values: dict[str, Any] | None = None,
        *,
        api_versions: tuple[str, ...] = (),
        release: str = RELEASE,
        namespace: str = NAMESPACE,
    ) -> Rendered:
        """``helm template`` with ``--kube-version`` and ``--api-versions``."""
        options = {
            "name": release,
            "namespace": namespace,
            "kube_version": f"v{KUBE_VERSION}",
            "api_versions": list(api_versions),
            "is_install": True,
        }
        files: dict[str, str] = json.loads(
            _native.call_string(
                "helm_render", self.chart._raw(), json.dumps(values or {}), json.dumps(options)
            )
        )
        rendered = Rendered(files)
        for name in sorted(files):
            if name.endswith(".yaml"):
                rendered.objects += [doc for doc in yaml.safe_load_all(files[name]) if doc]
        return rendered

    def lint(self, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """``helm lint --strict --kube-version``: the report's messages."""
        report = helm_python.lint(
            self.chart_dir, values, strict=True, kube_version=f"v{KUBE_VERSION}"
        )
        messages: list[dict[str, Any]] = report["messages"]
        return messages


@pytest.fixture(scope="session")
def harness() -> Iterator[ChartHarness]:
    """The chart in the repository, loaded once."""
    loaded = ChartHarness(CHART_DIR)
    yield loaded
    loaded.close()


@pytest.fixture
def chart_copy(tmp_path: Path) -> Path:
    """A scratch copy of the chart, to render with files the repository lacks."""
    target = tmp_path / "tokenstamp"
    shutil.copytree(CHART_DIR, target)
    return target


@pytest.fixture
def load_harness() -> Iterator[Callable[[Path], ChartHarness]]:
    """Load a harness for another chart directory; closed after the test."""
    loaded: list[ChartHarness] = []

    def load(chart_dir: Path) -> ChartHarness:
        loaded.append(ChartHarness(chart_dir))
        return loaded[-1]

    yield load
    for each in loaded:
        each.close()


@pytest.fixture(params=sorted(SCENARIOS))
def scenario(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Each ci/*-values.yaml scenario: (name, values)."""
    name: str = request.param
    return name, load_values(SCENARIOS[name])


@pytest.fixture(scope="session")
def sync_script() -> types.ModuleType:
    """scripts/sync_chart.py, imported as a module."""
    path = REPO_ROOT / "scripts" / "sync_chart.py"
    spec = importlib.util.spec_from_file_location("sync_chart", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses resolve annotations through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
