"""The Prometheus rule files: promtool-valid, unit-tested, named and annotated by convention."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import alerts, build

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
RULE_FILES = sorted((DASHBOARDS / "prometheus").glob("*.yaml"))
UNIT_TESTS = sorted((DASHBOARDS / "tests").glob("*.test.yaml"))
RUNBOOK = DASHBOARDS / "runbook.md"
LEVEL_METRIC_OPS = re.compile(r"^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$")


def _rules(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _all_rules() -> list[dict[str, Any]]:
    return [rule for path in RULE_FILES for rule in _rules(path)]


def test_rule_files_exist():
    names = {p.relative_to(DASHBOARDS).as_posix() for p in RULE_FILES}
    assert names == {build.RECORDING_FILE, build.ALERTS_FILE}
    assert UNIT_TESTS, "no promtool unit tests in dashboards/tests/"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(promtool, path):
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests(promtool, path):
    result = subprocess.run(
        [promtool, "test", "rules", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _tests_of(alert: str) -> list[Path]:
    """The unit-test files that check ``alert`` (each file takes promtool seconds to run)."""
    pattern = re.compile(r"alertname:\s*" + re.escape(alert) + r"\s*$", re.MULTILINE)
    return [p for p in UNIT_TESTS if pattern.search(p.read_text(encoding="utf-8"))]


def _run_broken(
    promtool: str, tmp_path: Path, rel: str, old: str, new: str, alert: str
) -> subprocess.CompletedProcess[str]:
    """Run the unit tests of ``alert`` against the rules with ``old`` replaced by ``new`` in ``rel``.

    Only the files that check ``alert``: the others cannot see the drift and cost
    promtool seconds each."""
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "tests").mkdir()
    for path in RULE_FILES:
        shutil.copy(path, tmp_path / "prometheus" / path.name)
    rule_file = tmp_path / rel
    text = rule_file.read_text(encoding="utf-8")
    broken = text.replace(old, new)
    assert broken != text
    rule_file.write_text(broken, encoding="utf-8")
    tests = _tests_of(alert)
    assert tests, f"no unit test checks {alert}"
    for path in tests:
        shutil.copy(path, tmp_path / "tests" / path.name)
    return subprocess.run(
        [promtool, "test", "rules", *(p.name for p in tests)],
        cwd=tmp_path / "tests",
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.parametrize(
    ("rel", "old", "new", "alert"),
    [
        # A threshold drifted.
        (
            build.ALERTS_FILE,
            "ratio_rate5m > 0.05",
            "ratio_rate5m > 0.5",
            "TokenstampPrefillStutter",
        ),
        # The tenant rules read unlabelled series too: the tenant alert would
        # duplicate the backend's SLO alerts without --tenant-header.
        (build.RECORDING_FILE, ', tokenstamp_tenant!=""', "", "TokenstampTenantGoodputBudgetBurn"),
        # No minimum of streams: a tenant with a handful of requests pages.
        (build.ALERTS_FILE, " >= 100", " >= 0", "TokenstampTenantGoodputBudgetBurn"),
        # The answer SLO judged by TTFT: a long reasoning would never page.
        (
            build.RECORDING_FILE,
            "tokenstamp_time_to_first_answer_token_seconds",
            "gen_ai_server_time_to_first_token_seconds",
            "TokenstampAnswerTTFTBudgetBurn",
        ),
    ],
    ids=["threshold", "tenant-label", "tenant-minimum", "answer-reads-ttft"],
)
def test_promtool_unit_tests_catch_a_broken_rule(promtool, tmp_path, rel, old, new, alert):
    """The unit tests would fail if a rule drifted: they cannot pass vacuously."""
    result = _run_broken(promtool, tmp_path, rel, old, new, alert)
    assert result.returncode != 0
    assert alert in result.stdout + result.stderr


def test_recording_rules_are_named_level_metric_operations():
    records = [r["record"] for r in _all_rules() if "record" in r]
    assert records
    for name in records:
        assert LEVEL_METRIC_OPS.match(name), name
    assert len(records) == len(set(records))


def test_every_recording_rule_is_used():
    """Recording rules exist for what dashboards and alerts share: none is dead."""
    records = [r["record"] for r in _all_rules() if "record" in r]
    consumers = [r["expr"] for r in _all_rules()]
    consumers += [p.read_text(encoding="utf-8") for p in (DASHBOARDS / "grafana").glob("*.json")]
    for name in records:
        pattern = re.compile(re.escape(name) + r"(?![a-z0-9_:])")
        assert any(pattern.search(text) for text in consumers), f"{name} is never read"


def test_every_alert_has_severity_and_annotations():
    alert_rules = [r for r in _all_rules() if "alert" in r]
    assert {r["alert"] for r in alert_rules} == set(alerts.ALERT_NAMES)
    for rule in alert_rules:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        annotations = rule["annotations"]
        assert set(annotations) >= {"summary", "description", "runbook_url"}, rule["alert"]
        assert annotations["summary"].strip()
        assert annotations["description"].strip()
        assert annotations["runbook_url"].endswith("runbook.md#" + rule["alert"].lower())


def test_runbook_has_a_section_per_alert():
    text = RUNBOOK.read_text(encoding="utf-8")
    headings = re.findall(r"^## (\S+)\s*$", text, flags=re.MULTILINE)
    assert headings == list(alerts.ALERT_NAMES)
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        for part in ("**Meaning.**", "**Likely causes.**", "**What to do.**"):
            assert part in section, f"{section.splitlines()[0]}: missing {part}"


def _unit_test_cases() -> list[dict[str, Any]]:
    cases = []
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


@pytest.mark.parametrize("name", alerts.ALERT_NAMES)
def test_every_alert_is_unit_tested_firing_and_silent(name):
    cases = [c for c in _unit_test_cases() if c["alertname"] == name]
    assert any(c.get("exp_alerts") for c in cases), f"{name}: no test where it fires"
    assert any(not c.get("exp_alerts") for c in cases), f"{name}: no test where it stays silent"


@pytest.mark.parametrize("severity", ["critical", "warning"])
@pytest.mark.parametrize(
    ("name", "ands"),
    [
        (alerts.TTFT_BURN, 1),
        (alerts.TPOT_BURN, 1),
        (alerts.ANSWER_TTFT_BURN, 1),
        (alerts.TENANT_GOODPUT_BURN, 2),
    ],
)
def test_burn_alerts_exist_per_severity(name, ands, severity):
    rules = [r for r in _all_rules() if r.get("alert") == name]
    assert severity in {r["labels"]["severity"] for r in rules}
    rule = next(r for r in rules if r["labels"]["severity"] == severity)
    # Multi-window: every condition pairs a long and a short window with "and"
    # (the tenant alert also asks for enough streams in the long window).
    assert rule["expr"].count(" and") + rule["expr"].count("\nand") == 2 * ands


def test_tenant_alert_reads_only_per_tenant_rules():
    """It keeps the tenant label, and never reads a rule that exists without tenants."""
    for rule in (r for r in _all_rules() if r.get("alert") == alerts.TENANT_GOODPUT_BURN):
        used = set(re.findall(r"[a-z_]+:[a-z_]+:[a-z_0-9]+", rule["expr"]))
        assert used
        assert all(name.startswith("server_address_tokenstamp_tenant:") for name in used)
        assert "{{ $labels.tokenstamp_tenant }}" in rule["annotations"]["summary"]


def test_answer_alert_reads_only_the_answer_rules():
    """The visible-TTFT alert judges the first answer event, not the first token."""
    rules_by_name = {r.get("record"): r for r in _all_rules() if "record" in r}
    for rule in (r for r in _all_rules() if r.get("alert") == alerts.ANSWER_TTFT_BURN):
        used = set(re.findall(r"[a-z_]+:[a-z_]+:[a-z_0-9]+", rule["expr"]))
        assert used
        assert all(":tokenstamp_answer_ttft_slo_errors_per_request:" in name for name in used)
        for name in used:
            assert "tokenstamp_time_to_first_answer_token_seconds_" in rules_by_name[name]["expr"]
            assert "gen_ai_server_time_to_first_token" not in rules_by_name[name]["expr"]
