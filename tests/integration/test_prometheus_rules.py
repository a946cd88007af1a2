"""examples/prometheus/fdl-probe.rules.yml: `promtool check rules`, its unit tests (`promtool test rules` on
fdl-probe.rules.test.yml beside it), that those tests can fail, and that every metric the rules read is one
`fdl probe --textfile` writes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from fdl.hostside.checks.textfile import FAMILIES
from tests.conftest import REPO
from tests.prometheus import need_tool

EXAMPLES = REPO / "examples" / "prometheus"
RULES = EXAMPLES / "fdl-probe.rules.yml"
UNIT_TESTS = EXAMPLES / "fdl-probe.rules.test.yml"


def promtool(*args: str, cwd: Path = EXAMPLES) -> subprocess.CompletedProcess:
    return subprocess.run([need_tool("promtool", "prometheus"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    done = promtool("test", "rules", str(UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_unit_tests_fail_when_a_rule_changes(tmp_path: Path) -> None:
    """A not-ready alert that fires after 1 minute instead of 15 must fail the unit tests."""
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    text = RULES.read_text()
    rule = "expr: fdl_probe_ready == 0\n        for: "
    changed = text.replace(rule + "15m", rule + "1m")
    assert changed != text
    (tmp_path / RULES.name).write_text(changed)
    done = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert done.returncode == 1 and "alertname: FdlHostNotReady, time: 16m" in done.stdout + done.stderr


def test_every_metric_the_rules_read_is_one_the_probe_writes() -> None:
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    read = {name for rule in rules for name in re.findall(r"\bfdl_[a-z_]+\b", rule["expr"])}
    read |= {name for rule in rules for text in rule.get("annotations", {}).values()
             for name in re.findall(r'printf "(fdl_[a-z_]+)', text)}  # the queries inside annotations
    assert sorted(name for name in read if name not in FAMILIES) == []
    assert {"fdl_probe_ready", "fdl_probe_check_status", "fdl_gpu_ecc_uncorrected_errors_total",
            "fdl_gpu_pcie_link_width", "fdl_probe_last_run_timestamp_seconds"} <= read
