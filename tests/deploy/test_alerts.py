"""deploy/prometheus/alerts.yaml: valid rules, each alert documented and unit-tested with
``promtool test rules`` (deploy/prometheus/alerts_test.yaml)."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from tests.deploy.promtool import RULES, tool

TESTS = RULES.with_name("alerts_test.yaml")


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_the_rules_are_valid() -> None:
    result = subprocess.run([tool("promtool"), "check", "rules", str(RULES)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_passes_its_unit_tests() -> None:
    result = subprocess.run([tool("promtool"), "test", "rules", TESTS.name], cwd=TESTS.parent,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_summary_a_runbook_and_a_unit_test() -> None:
    tested = {case["alertname"] for test in yaml.safe_load(TESTS.read_text())["tests"]
              for case in test["alert_rule_test"] if case["exp_alerts"]}
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)) == 11
    assert tested == set(names)
    for rule in alerts():
        assert rule["annotations"]["summary"] and rule["annotations"]["runbook"], rule
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
