"""The architecture as the tree shows it: which package may import which.

Read statically from the source (every ``import``, also those made only for
type checking or inside a function), so an import that runs only on one path
still counts. docs/architecture.md describes the same arrows.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proxy", "exporters", "simulator", "bench", "demo")
FRAMEWORKS = ("asyncio", "aiohttp", "prometheus_client", "opentelemetry")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported(name: str, path: Path) -> set[str]:
    """Every module name ``path`` imports, absolute (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    modules = _modules()
    return {m: (_imported(m, p) & modules.keys()) - {m} for m, p in modules.items()}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_module_imports_one_that_imports_it_back(graph):
    # Tarjan's strongly connected components: any component of two or more is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_proxy_imports_neither_simulator_nor_bench_nor_demo(graph):
    bad = {
        (m, t)
        for m, targets in graph.items()
        if _within(m, "proxy")
        for t in targets
        if any(_within(t, p) for p in ("simulator", "bench", "demo"))
    }
    assert bad == set()


def test_the_core_imports_nothing_of_tokenstamp_outside_the_core(graph):
    bad = {
        (m, t)
        for m, targets in graph.items()
        if _within(m, "proxy.core")
        for t in targets
        if not _within(t, "proxy.core")
    }
    assert bad == set()


def test_exporters_use_only_the_core_contract_and_their_names(graph):
    # ``proxy`` itself is the package root (its version string), nothing else.
    bad = {
        (m, t)
        for m, targets in graph.items()
        if _within(m, "exporters")
        for t in targets
        if not (_within(t, "exporters") or _within(t, "proxy.core") or t == "proxy")
    }
    assert bad == set()


def test_timeline_and_core_are_below_the_edge(graph):
    # Nothing below the HTTP edge (core, timeline, exporters) may reach up into it.
    bad = {
        (m, t)
        for m, targets in graph.items()
        if any(
            _within(m, p) for p in ("proxy.core", "proxy.timeline", "proxy.advisor", "exporters")
        )
        for t in targets
        if _within(t, "proxy.edge")
    }
    assert bad == set()


def test_the_proxy_folder_keeps_its_top_level_small():
    top = sorted(p.name for p in (ROOT / "proxy").glob("*.py"))
    assert len(top) <= 12, top


def _pure_modules() -> list[str]:
    core = [m for m in _modules() if _within(m, "proxy.core")]
    advisor = [
        f"proxy.advisor.{m}"
        for m in ("observations", "context", "pieces", "fit", "predict", "report")
    ]
    return sorted([*core, "proxy.timeline.buffer", "proxy.timeline.tokenlog", *advisor])


def test_every_core_module_imports_no_framework():
    """Imported for real in a fresh interpreter: what they pull in transitively counts."""
    modules = _pure_modules()
    assert "proxy.core.timing" in modules
    assert "proxy.core.decoders.sse" in modules
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded = json.loads(out.stdout)
    assert [m for m in loaded if m.split(".")[0] in FRAMEWORKS] == []
