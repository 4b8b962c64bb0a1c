"""scripts/sync_chart.py: the chart's rules and dashboards are copies of dashboards/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DASHBOARD = json.dumps({"title": "Serving latency", "panels": []}, indent=2) + "\n"
RULES = "# generated\ngroups:\n  - name: a\n    rules: []\n"
RULE_TEST = "rule_files:\n  - ../prometheus/alerts.yaml\ntests: []\n"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _held(chart: Path) -> dict[str, str]:
    files = chart / "files"
    if not files.is_dir():
        return {}
    return {
        str(p.relative_to(files)): p.read_text(encoding="utf-8")
        for p in sorted(files.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """An empty source (dashboards/) and chart directory."""
    source, chart = tmp_path / "dashboards", tmp_path / "chart"
    source.mkdir()
    chart.mkdir()
    return source, chart


def test_chart_holds_exactly_the_dashboards_of_the_repository(harness):
    """The check a developer runs: fails until `python scripts/sync_chart.py` is rerun."""
    result = subprocess.run(
        [sys.executable, str(harness.repo_root / "scripts" / "sync_chart.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_no_sources_yet_leaves_the_chart_empty(sync_script, tree, tmp_path):
    source, chart = tree
    assert sync_script.sync(source, chart) == []
    assert sync_script.differences(source, chart) == []
    assert sync_script.differences(tmp_path / "absent", chart) == []
    assert _held(chart) == {}


def test_copies_dashboards_and_rule_files_and_nothing_else(sync_script, tree):
    source, chart = tree
    _write(source / "grafana" / "serving-latency.json", DASHBOARD)
    _write(source / "prometheus" / "tokenstamp.alerts.yml", RULES)
    _write(source / "tests" / "alerts.test.yaml", RULE_TEST)
    _write(source / "schema-check" / "package.json", '{"name": "schema-check"}\n')
    _write(source / "schema-check" / "node_modules" / "x" / "d.json", DASHBOARD)
    _write(source / ".cache" / "d.json", DASHBOARD)
    _write(source / "config.yaml", "selector: job\n")
    _write(source / "broken.json", "{not json")

    changed = sync_script.sync(source, chart)

    assert len(changed) == 2
    assert _held(chart) == {
        "dashboards/serving-latency.json": DASHBOARD,
        "rules/tokenstamp.alerts.yaml": RULES,
    }
    assert sync_script.differences(source, chart) == []
    assert sync_script.sync(source, chart) == []


def test_check_reports_changed_new_and_removed_sources(sync_script, tree):
    source, chart = tree
    dashboard = _write(source / "d.json", DASHBOARD)
    rules = _write(source / "r.yaml", RULES)
    sync_script.sync(source, chart)

    dashboard.write_text(DASHBOARD.replace("Serving", "Decode"), encoding="utf-8")
    rules.unlink()
    _write(source / "new.yaml", RULES)
    problems = sync_script.differences(source, chart)
    assert [p.split(":")[0] for p in problems] == ["differs", "missing", "stale"]
    assert sync_script.main(["--check", "--source", str(source), "--chart", str(chart)]) == 1

    assert sync_script.main(["--source", str(source), "--chart", str(chart)]) == 0
    assert _held(chart) == {
        "dashboards/d.json": DASHBOARD.replace("Serving", "Decode"),
        "rules/new.yaml": RULES,
    }
    assert sync_script.main(["--check", "--source", str(source), "--chart", str(chart)]) == 0


def test_two_sources_with_one_name_are_an_error(sync_script, tree, capsys):
    source, chart = tree
    _write(source / "a" / "alerts.yaml", RULES)
    _write(source / "b" / "alerts.yml", RULES)
    assert sync_script.main(["--source", str(source), "--chart", str(chart)]) == 2
    assert "rename one" in capsys.readouterr().err
    assert _held(chart) == {}


def test_files_outside_the_copies_are_kept(sync_script, tree):
    """The chart's files/README.md is not a copy and survives a sync."""
    source, chart = tree
    _write(chart / "files" / "README.md", "generated\n")
    sync_script.sync(source, chart)
    assert _held(chart) == {"README.md": "generated\n"}
