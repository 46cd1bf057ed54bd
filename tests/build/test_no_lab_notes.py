"""Profiles, templates, roles, playbooks, Packer, scripts and the build files are data and
code: a comment says what a setting does and why, and links to its evidence; measured figures
and run numbers live in docs/ only."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from conftest import ROOT

# a run number, a ratio against something, a rate, a share, a time with a decimal
FIGURE = re.compile(r"\bruns? \(?\d+\b|#run-\d+|\b\d+\.\d+x\b|\btok/s\b|\b\d+(\.\d+)? ?%|"
                    r"\b\d+\.\d+ ?(ms|s|us|GiB|GB)\b", re.I)
COMMENT = re.compile(r"(?:^|\s)#(?!!)(.*)$|\{#(.*?)#\}", re.S)


def comments(path: Path) -> list[tuple[int, str]]:
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        for m in COMMENT.finditer(line):
            out.append((i, m[1] or m[2] or ""))
    return out


FILES = sorted({*(p for d in ("profiles", "templates", "roles", "ansible", "packer", "scripts", ".ci")
                  for p in (ROOT / d).rglob("*")
                  if p.is_file() and p.suffix in (".yaml", ".yml", ".j2", ".hcl", ".sh", "")
                  and "files/locks" not in str(p)),
                ROOT / "Makefile", ROOT / "requirements.txt", ROOT / "pyproject.toml"})


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_no_measured_figure_or_run_number_in_a_comment(path: Path) -> None:
    hits = [f"{path.relative_to(ROOT)}:{i}: {text.strip()[:120]}" for i, text in comments(path)
            if FIGURE.search(text)]
    assert not hits, "figures belong in docs/ (link the evidence instead):\n" + "\n".join(hits)


def test_the_rule_finds_what_it_is_for(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("a: 1  # 1.78x vanilla at c=1 (run 44)\nb: 2  # the 8x H100 tier\n"
                 "c: 3  # see docs/benchmarks.md#run-44\nd: 4  # see docs/decisions.md#ready-time\n")
    assert [i for i, t in comments(f) if FIGURE.search(t)] == [1, 3]


# Python: a run number, a measured ratio or a measured time (units and thresholds such as "tok/s"
# or "10 %" name what is measured, not a measurement)
PY_FIGURE = re.compile(r"\bruns? \(?\d+\b(?! \+)|#run-\d+|\b\d+\.\d+x\b|\b\d+\.\d+ ?(ms|s|us|GiB|GB)\b",
                       re.I)
PY_FILES = sorted(p for d in ("src/inference_image", "lab/inference_lab", "machine/inference_machine",
                            "plugins/vllm/inference_image_vllm", "image_tests", "scripts", "tests")
                  for p in (ROOT / d).rglob("*.py") if "golden" not in p.parts
                  and p.name != "test_no_lab_notes.py")  # this file's own examples are figures


def python_notes(path: Path) -> list[tuple[int, str]]:
    """Every comment and docstring of a Python file, with its line."""
    src = path.read_text()
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


@pytest.mark.parametrize("path", PY_FILES, ids=[str(p.relative_to(ROOT)) for p in PY_FILES])
def test_no_run_number_or_measured_figure_in_the_python(path: Path) -> None:
    hits = [f"{path.relative_to(ROOT)}:{i}: {m[0]!r} in {text.strip()[:100]!r}"
            for i, text in python_notes(path) for m in PY_FIGURE.finditer(text)]
    assert not hits, "figures belong in docs/ (link the evidence instead):\n" + "\n".join(hits)


def test_the_python_rule_finds_what_it_is_for(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('"""Fast (run 37: 3.30 ms)."""\nX = 1  # each step runs 1 + k tokens\n'
                 'Y = 2  # 1.4x vanilla\nZ = 3  # every multi-GPU Run (42-47)\n'
                 'W = 4  # it used 61.7 GiB\nV = 5  # docs/benchmarks.md#run-44\n')
    assert sorted(i for i, t in python_notes(f) if PY_FIGURE.search(t)) == [1, 3, 4, 5, 6]


# this project's issue named where the reason should be ("issue 67", "issue 19, item 8"); another
# project's issue (vLLM's, as evidence of a figure) names its project first
OWN_ISSUE = re.compile(r"(?<!vLLM )(?<!vllm )\b[Ii]ssues? #?\d+")


def test_a_note_says_its_reason_and_not_an_issue_number() -> None:
    hits = [f"{p.relative_to(ROOT)}:{i}: {text.strip()[:100]!r}"
            for p in PY_FILES for i, text in python_notes(p) if OWN_ISSUE.search(text)]
    hits += [f"{p.relative_to(ROOT)}:{i}: {text.strip()[:100]!r}"
             for p in FILES for i, text in comments(p) if OWN_ISSUE.search(text)]
    assert not hits, "say why, not which issue asked:\n" + "\n".join(hits)
    assert OWN_ISSUE.search("the units before issue 67") and \
        not OWN_ISSUE.search("(vLLM issue 26191, quoting PR 17504)")
