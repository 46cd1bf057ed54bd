"""scripts/junit-failures: what `make molecule` prints last when molecule fails (CI's log tail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SCRIPT = ROOT / "scripts/junit-failures"


def test_it_names_each_failed_test_with_the_end_of_its_message(tmp_path: Path) -> None:
    report = tmp_path / "image_tests.xml"
    trace = "\n".join(f"line {i}" for i in range(40)) + "\nE   AssertionError: 3 pending security updates"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="test_hygiene" name="test_firewall_active" time="0.1"/>'
        '<testcase classname="test_hygiene" name="test_no_pending_security_updates" time="2">'
        f'<failure message="AssertionError">{trace}</failure></testcase>'
        '<testcase classname="test_smoke" name="test_router_answers" time="1">'
        '<error message="fixture failed">podman exec timed out</error></testcase>'
        '</testsuite></testsuites>')
    out = subprocess.run([sys.executable, SCRIPT, str(report), str(tmp_path / "absent.xml")],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "FAILURE test_hygiene::test_no_pending_security_updates (image_tests.xml)"
    assert lines[-3].strip() == "E   AssertionError: 3 pending security updates"
    assert "line 28" not in out and "line 29" in out  # the last 12 lines of the trace only
    assert lines[-2] == "ERROR test_smoke::test_router_answers (image_tests.xml)"
    assert "test_firewall_active" not in out


def test_no_failure_says_so(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text('<testsuite><testcase classname="a" name="b"/></testsuite>')
    out = subprocess.run([sys.executable, SCRIPT, str(report)], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == f"no failed test in {report}"
