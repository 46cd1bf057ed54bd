"""docs/operations.md's Prometheus scrape configuration is one Prometheus takes (its own
`promtool check config`, with the token and certificate files it names made for real) and names
the targets the image serves under /metrics/<target>."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml
from conftest import ROOT

from inference_image.profiles import resolve
from inference_image.render import PATHS, ansible_vars, prometheus_targets, render, scrape_targets
from inference_machine import contract

DOC = ROOT / "docs/operations.md"


def scrape_config() -> str:
    text = DOC.read_text()
    block = text.split("<!-- scrape-config: begin -->\n", 1)[1].split("<!-- scrape-config: end -->")[0]
    m = re.fullmatch(r"```yaml\n(.*)```\n", block, re.S)
    assert m, "the scrape config is not one yaml block between its markers"
    return m.group(1)


def test_the_documented_scrape_config_is_one_prometheus_takes(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (make deps installs it)"
    config = scrape_config()
    job = yaml.safe_load(config)["scrape_configs"][0]
    token = Path(job["authorization"]["credentials_file"])
    cert = Path(job["tls_config"]["ca_file"])
    local = tmp_path / "etc"
    local.mkdir()
    (local / token.name).write_text("0" * 64 + "\n")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=t",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(local / cert.name)],
                   check=True, capture_output=True)
    config = config.replace(str(token), str(local / token.name)).replace(str(cert),
                                                                        str(local / cert.name))
    path = tmp_path / "prometheus.yml"
    path.write_text(config)
    run = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    # and promtool refuses what is no config: the check above can fail
    path.write_text(config.replace("scrape_configs", "scrape_config"))
    assert subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                          check=False).returncode != 0


def test_the_documented_targets_are_what_a_one_instance_tier_serves() -> None:
    job = yaml.safe_load(scrape_config())["scrape_configs"][0]
    paths = [s["labels"]["__metrics_path__"] for s in job["static_configs"]]
    served = [f"/metrics/{t['name']}" for t in scrape_targets(resolve("h100"))]
    assert paths == served, (paths, served)
    assert all(s["labels"]["target"] == s["labels"]["__metrics_path__"].rsplit("/", 1)[1]
               for s in job["static_configs"])
    # the label the shipped rules and dashboard select, on every target
    label, value = contract.SCRAPE_LABEL
    assert all(s["labels"].get(label) == value for s in job["static_configs"])


def test_the_shipped_alert_rules_are_ones_prometheus_takes(tmp_path: Path) -> None:
    """docs/operations/alerts.yml passes `promtool check rules`; each rule says what is wrong
    (summary) and how bad (severity), and reads metrics the image tests can look for."""
    from inference_image.ops.observability import ALERTS, metric_names, rules_metrics
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (make deps installs it)"
    run = subprocess.run([promtool, "check", "rules", str(ROOT / ALERTS)], capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = yaml.safe_load((ROOT / ALERTS).read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert rules and all(r["labels"]["severity"] in ("critical", "warning", "info") and
                         r["annotations"]["summary"] for r in rules)
    assert all(rules_metrics().values()), "a rule whose metrics were not found"
    assert metric_names('histogram_quantile(0.9, sum by (le) (rate(a_bucket{x="y"}[5m]))) > 1e9'
                        " and on(instance) b") == {"a_bucket", "b"}
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rate(x[5m]\n")
    assert subprocess.run([promtool, "check", "rules", str(bad)], capture_output=True,
                          check=False).returncode != 0


def test_every_dashboard_query_is_promql_prometheus_parses(tmp_path: Path) -> None:
    """docs/operations/dashboard.json: each panel has a query, each query parses (promtool, as a
    recording rule), and the dashboard picks its Prometheus and machines by variables."""
    from inference_image.ops.observability import DASHBOARD, dashboard_as_rules, dashboard_metrics
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (make deps installs it)"
    rules = tmp_path / "dashboard-rules.yml"
    rules.write_text(dashboard_as_rules())
    run = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    metrics = dashboard_metrics()
    assert metrics and all(metrics.values()), metrics
    doc = json.loads((ROOT / DASHBOARD).read_text())
    assert {v["name"] for v in doc["templating"]["list"]} == {"datasource", "instance"}
    # every query selects the machines by the label every scrape job carries, none by a job name
    # (a fleet's scrape-config names one job a droplet)
    label, value = contract.SCRAPE_LABEL
    queries = [t["expr"] for p in doc["panels"] for t in p["targets"]] + [
        v["query"] for v in doc["templating"]["list"] if v["name"] == "instance"]
    assert queries and all(f'{label}="{value}"' in q and "job=" not in q for q in queries), \
        [q for q in queries if f'{label}="{value}"' not in q or "job=" in q]
    assert all(t["datasource"]["uid"] == "${datasource}" for p in doc["panels"]
               for t in p["targets"])


def test_the_local_agent_and_the_public_port_list_the_same_sources(tmp_path: Path) -> None:
    """The machine's file_sd list (an agent on the machine) and the public port's /metrics/<name>
    (a remote Prometheus) are made from one list of sources, so neither names a page the other
    misses; the list is a rendered file the image installs like the others."""
    r = resolve("h200x8")
    local = sorted(t for g in prometheus_targets(r) for t in g["targets"])
    public = sorted(f"127.0.0.1:{t['port']}" for t in scrape_targets(r))
    assert local == public and len(local) == len(r.instances) + 4  # router, node, nginx, gpu
    render(r, tmp_path)
    written = json.loads((tmp_path / PATHS["prometheus_targets"].lstrip("/")).read_text())
    assert written == prometheus_targets(r)
    assert {g["labels"]["job"] for g in written} == {"vllm", "vllm-router", "node", "nginx",
                                                     "dcgm"}
    label, value = contract.SCRAPE_LABEL
    assert all(g["labels"][label] == value for g in written)
    # a tier without GPUs has no DCGM exporter to list
    assert "dcgm" not in {g["labels"]["job"] for g in prometheus_targets(resolve("cpu"))}


def test_every_gpu_series_a_rule_or_panel_reads_is_one_the_exporter_is_started_with() -> None:
    """The GPU rules read DCGM fields: each is in the counters file the observability role
    starts NVIDIA's exporter with (a field left out there is a series nobody serves), and that
    file is what the role's drop-in names."""
    from inference_image.ops.observability import (
        DCGM_COUNTERS,
        DCGM_NVSWITCH_COUNTERS,
        DCGM_PREFIX,
        dashboard_metrics,
        dcgm_counters,
        rules_metrics,
    )

    base, fabric = dcgm_counters(), dcgm_counters(ROOT / DCGM_NVSWITCH_COUNTERS)
    counters = base | fabric
    assert base and fabric and not base & fabric, (base, fabric)
    assert all(c.startswith(DCGM_PREFIX) for c in counters), counters
    # a fabric tier's render asks for the fabric's fields, a tier without one not
    assert ansible_vars(resolve("h100x8"))["observability_nvswitch"] is True
    assert ansible_vars(resolve("h100"))["observability_nvswitch"] is False
    read = {what: {m for m in names if m.startswith(DCGM_PREFIX)}
            for what, names in {**rules_metrics(), **dashboard_metrics()}.items()}
    assert any(read.values()), "no rule reads a GPU series"
    assert not {w: sorted(n - counters) for w, n in read.items() if n - counters}
    dropin = (ROOT / "roles/observability/templates/etc/systemd/system"
              "/nvidia-dcgm-exporter.service.d/inference-image.conf.j2").read_text()
    assert f"-f /etc/dcgm-exporter/{DCGM_COUNTERS.name} " in dropin
