"""Prometheus configuration and alert rules: promtool accepts them and every rule is tested.

promtool is the authority on what Prometheus will load, so these tests run it rather than
re-implementing its checks; CI installs it (Debian package `prometheus`, see .ci/run) and a
missing promtool fails here instead of skipping. Beyond promtool, each alert must carry what
an on-call engineer needs (for, severity, summary, description, a runbook anchor that exists in
docs/observability.md) and must have a firing and a quiet case in deploy/prometheus/tests/.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
CONFIG = PROMETHEUS / "prometheus.yml"
RULES = PROMETHEUS / "alerts.yml"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
RUNBOOK_DOC = ROOT / "docs" / "observability.md"
SEVERITIES = {"critical", "warning"}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: .ci/run installs it (apt-get install prometheus)"
    return path


def _run(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True,
                          timeout=60, cwd=PROMETHEUS, check=False)


def _alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the headings: lowercased, punctuation dropped, spaces to '-'."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


def test_config_is_valid(promtool: str) -> None:
    result = _run(promtool, "check", "config", CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_are_valid(promtool: str) -> None:
    result = _run(promtool, "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_pass(promtool: str) -> None:
    assert RULE_TESTS, "no promtool rule tests found"
    result = _run(promtool, "test", "rules", *RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS), result.stdout


def test_config_loads_the_rules_and_scrapes_every_service() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"api", "worker", "maintenance", "redis-exporter", "postgres-exporter"} <= jobs


@pytest.mark.parametrize("rule", _alerts(), ids=lambda rule: rule["alert"])
def test_alert_tells_on_call_what_to_do(rule: dict) -> None:
    assert rule.get("for"), "an alert without `for` pages on one bad scrape"
    assert rule["labels"]["severity"] in SEVERITIES
    notes = rule["annotations"]
    assert notes["summary"].strip() and notes["description"].strip()
    page, _, anchor = notes["runbook"].partition("#")
    assert page == "docs/observability.md" and anchor == rule["alert"].lower()
    assert anchor in _anchors(RUNBOOK_DOC.read_text()), f"no runbook section for {anchor}"


def _cases() -> dict[str, set[str]]:
    """alertname -> the kinds of case its promtool tests have: 'firing' and/or 'quiet'."""
    cases: dict[str, set[str]] = {}
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                kind = "firing" if case.get("exp_alerts") else "quiet"
                cases.setdefault(case["alertname"], set()).add(kind)
    return cases


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = _cases()
    for rule in _alerts():
        assert cases.get(rule["alert"]) == {"firing", "quiet"}, rule["alert"]


def test_alert_names_are_unique() -> None:
    names = [rule["alert"] for rule in _alerts()]
    assert len(names) == len(set(names))
