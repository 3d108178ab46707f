"""deploy/prometheus/arm-core-rules.yml with Prometheus's own tool (Debian package
`prometheus`): the rules load (`promtool check rules`), their unit tests pass (`promtool
test rules`), every alert has a test in which it fires and one in which it does not, and
every alert's runbook entry exists in docs/runbooks.md."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "arm-core-rules.yml"
TESTS = RULES.with_name("arm-core-rules.test.yml")
RUNBOOKS = REPO / "docs" / "runbooks.md"

pytestmark = pytest.mark.integration


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def alerts() -> dict[str, dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", TESTS.name],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    assert set(alerts()) == fires, set(alerts()) ^ fires
    assert set(alerts()) == silent, set(alerts()) ^ silent


def test_every_alert_has_a_severity_a_summary_and_its_runbook_entry() -> None:
    headings = {
        re.sub(r"[^a-z0-9-]", "", line[4:].strip().lower().replace(" ", "-"))
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("### ")
    }
    for name, rule in alerts().items():
        labels, notes = rule["labels"], rule["annotations"]
        assert isinstance(labels, dict) and labels["severity"] in ("critical", "warning"), name
        assert isinstance(notes, dict) and notes["summary"], name
        # Prefixed by the external label runbook_base: the file is loaded without edits.
        base = "{{ $externalLabels.runbook_base }}"
        assert notes["runbook_url"] == f"{base}docs/runbooks.md#{name.lower()}", name
        assert name.lower() in headings, f"docs/runbooks.md has no '### {name}'"
