"""The alert rules the project ships for a Prometheus that scrapes its machines
(docs/operations/alerts.yml): which metrics they read, so that a test can hold each to one a
machine serves."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .profiles import project_root

ALERTS = Path("docs/operations/alerts.yml")
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
