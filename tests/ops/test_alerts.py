"""The alert rules of ``deploy/prometheus/`` under promtool's rule tests
(``tests/ops/alerts/azqueue-rules.test.yml``): each rule stays quiet on a healthy
deployment with default settings, busy or at rest, and fires on what it is about.

promtool is Debian's ``prometheus`` package, which ``scripts/bootstrap --test`` installs;
without it the test is skipped, except under CI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ops.test_deploy import DEPLOY, alert_expressions
from tests.servers import IN_CI

RULES = DEPLOY / "prometheus" / "azqueue-rules.yml"
TESTS = Path(__file__).parent / "alerts" / "azqueue-rules.test.yml"
QUIET_ON = ("healthy", "at rest")


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = ("promtool is missing: scripts/bootstrap --test installs Debian's prometheus "
                   "package (apt-get install prometheus)")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return found


def test_every_rule_is_tested_quiet_on_a_healthy_deployment_and_firing() -> None:
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    quiet = {name: {c["alertname"] for t in tests if t["name"] == name
                    for c in t["alert_rule_test"] if not c["exp_alerts"]} for name in QUIET_ON}
    firing = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    for alert in alert_expressions():
        for name in QUIET_ON:
            assert alert in quiet[name], f"{alert} is not tested quiet on {name!r}"
        assert alert in firing, f"{alert} is never tested firing"


def test_the_rules_pass_promtools_checks_and_tests(promtool: str) -> None:
    for command in (["check", "rules", str(RULES)], ["test", "rules", str(TESTS)]):
        done = subprocess.run([promtool, *command], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"promtool {' '.join(command)}:\n{done.stdout}{done.stderr}"
