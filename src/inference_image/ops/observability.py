"""The alert rules and the Grafana dashboard the project ships for a Prometheus that scrapes its
machines (docs/operations/alerts.yml, dashboard.json): which metrics they read, so that a test
can hold each to one a machine serves, and the dashboard's queries as rules promtool can check."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from ..profiles import project_root

ALERTS = Path("docs/operations/alerts.yml")
DASHBOARD = Path("docs/operations/dashboard.json")
# the DCGM fields the GPU tiers' exporter serves (the observability role starts it with this file)
DCGM_COUNTERS = Path("roles/observability/files/dcgm-counters.csv")
# the fields added where the tier has an NVSwitch fabric (hardware.nvswitch)
DCGM_NVSWITCH_COUNTERS = Path("roles/observability/files/dcgm-counters-nvswitch.csv")
# what every DCGM exporter series is named after
DCGM_PREFIX = "DCGM_FI_"
# what a dashboard variable stands for when its queries are checked outside Grafana
VARIABLES = {"$instance": ".*"}
# PromQL words that are no metric
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
             "unless", "bool", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metrics a PromQL expression reads: its identifiers less functions (a name followed by
    a parenthesis), label matchers and groupings, ranges, strings and keywords."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    s = re.sub(r"\[[^\]]*\]", "", s)  # ranges
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end():].lstrip().startswith("(") or m.group(0) in _KEYWORDS:
            continue
        if m.start() and (s[m.start() - 1].isdigit() or s[m.start() - 1] == "."):
            continue  # the exponent of a number, 1e9
        names.add(m.group(0))
    return names


def rules_metrics(path: Path | None = None) -> dict[str, set[str]]:
    """alert name -> the metrics its expression reads, for the shipped rules file."""
    doc = yaml.safe_load((path or project_root() / ALERTS).read_text())
    return {r["alert"]: metric_names(str(r["expr"]))
            for g in doc["groups"] for r in g["rules"] if "alert" in r}


def dashboard_queries(path: Path | None = None) -> dict[str, list[str]]:
    """panel title -> its PromQL queries, the dashboard's variables given a value that matches
    everything."""
    doc = json.loads((path or project_root() / DASHBOARD).read_text())
    out: dict[str, list[str]] = {}
    for panel in doc["panels"]:
        exprs = []
        for target in panel.get("targets", []):
            expr = str(target["expr"])
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            exprs.append(expr)
        out[str(panel["title"])] = exprs
    return out


def dashboard_metrics(path: Path | None = None) -> dict[str, set[str]]:
    """panel title -> the metrics its queries read."""
    return {title: set().union(*(metric_names(e) for e in exprs))
            for title, exprs in dashboard_queries(path).items()}


def dashboard_as_rules(path: Path | None = None) -> str:
    """The dashboard's queries as recording rules, for `promtool check rules` to parse."""
    rules = [{"record": f"dashboard:panel_{i}_{j}", "expr": e}
             for i, exprs in enumerate(dashboard_queries(path).values())
             for j, e in enumerate(exprs)]
    return yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})


def dcgm_counters(path: Path | None = None) -> set[str]:
    """The DCGM fields in an exporter counters file (its non-comment lines' first column)."""
    lines = (path or project_root() / DCGM_COUNTERS).read_text().splitlines()
    return {ln.split(",", 1)[0].strip() for ln in lines if ln.strip() and not ln.startswith("#")}
