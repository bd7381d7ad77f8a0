"""Every gpuhealth alert is proven by promtool: it fires when it should and stays silent otherwise.

The rule groups come from the shipped PrometheusRule (what kube-prometheus-stack would load); the
cases live in gpuhealth-rules.test.yaml. A new alert without a case fails here.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from devkit.tools import run

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RULE = REPO / "manifests" / "components" / "prometheus" / "prometheusrule.yaml"
CASES = HERE / "gpuhealth-rules.test.yaml"


def _alerts(groups: list[dict[str, Any]]) -> set[str]:
    return {r["alert"] for g in groups for r in g["rules"] if "alert" in r}


def _rules_dir(tmp_path: Path) -> Path:
    rule = yaml.safe_load(RULE.read_text())
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    shutil.copy(CASES, tmp_path / CASES.name)
    return tmp_path


def test_rules_are_valid(tmp_path: Path) -> None:
    d = _rules_dir(tmp_path)
    out = run("promtool", "check", "rules", str(d / "rules.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    rule = yaml.safe_load(RULE.read_text())
    cases = yaml.safe_load(CASES.read_text())["tests"]
    fires = {t["alertname"] for c in cases for t in c.get("alert_rule_test", []) if t["exp_alerts"]}
    silent = {t["alertname"] for c in cases for t in c.get("alert_rule_test", []) if not t["exp_alerts"]}
    alerts = _alerts(rule["spec"]["groups"])
    assert len(alerts) >= 7
    assert alerts - fires == set(), "alerts without a case where they fire"
    assert alerts - silent == set(), "alerts without a case where they stay silent"


def test_alert_unit_tests_pass(tmp_path: Path) -> None:
    d = _rules_dir(tmp_path)
    out = run("promtool", "test", "rules", CASES.name, cwd=d)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
