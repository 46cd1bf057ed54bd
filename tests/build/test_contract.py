"""The machine's contract (inference_machine.contract) is said once: no literal of it (an
INFERENCE_* variable the runtime reads, a cache part, a service user, a unit the build enables)
appears as data anywhere else in code, a template, a role or a script; everything else reads it
from the contract or from the render, which writes it whole into profile.json and the extra-vars.
Comments and docstrings may name them (they say what, not use it)."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
from pathlib import Path

from conftest import ROOT

from inference_image.profiles import resolve
from inference_image.render import ansible_vars, profile_document
from inference_machine import contract

CONTRACT = ROOT / "machine/inference_machine/contract.py"
ENV_NAMES = set(contract.asdict(contract.ENV).values())
USERS = {contract.SERVICE_USER, contract.ROUTER_USER}
ENABLED = {u.name for u in contract.UNITS if u.enabled}
# a cache part as a path under the cache (".../inductor"), or a part name the generic words do not
# share ("vllm", "triton" and "tmp" are package and folder names everywhere else)
PART_PATH = re.compile(r"(?:cache|\}|\))/(?:" + "|".join(
    re.escape(c.name) for c in contract.CACHE_PARTS) + r")\b")
DISTINCT_PARTS = {"inductor", "xdg-cache", "xdg-config"}

# where a literal stays, and why (each says why; empty is the goal)
EXCEPTIONS: dict[str, str] = {
    # the units' own files name one another as systemd reads them (Wants=, After=, Requires=):
    # a Jinja variable for each would hide the dependency it states
    "templates/etc/systemd/*:units": "systemd's own dependency lines",
    # the plugin runs in vLLM's virtualenv, which has not the machine's runtime: its switches'
    # table holds the two names the runtime gives it, and test_plugin_switches holds them equal
    "plugins/vllm/inference_image_vllm/switches.py:env": "the plugin's own table, held equal",
    # a sampling profile's part (Inductor's compile), not the cache's folder of that name
    "lab/inference_lab/spy.py:parts": "a profile's phase named after the compiler",
}
CODE = [*ROOT.glob("machine/inference_machine/*.py"), *ROOT.glob("src/inference_image/**/*.py"),
        *ROOT.glob("lab/inference_lab/*.py"), *ROOT.glob("plugins/vllm/inference_image_vllm/*.py"),
        *ROOT.glob("image_tests/*.py")]
TEXT = [*ROOT.glob("templates/**/*.j2"), *ROOT.glob("roles/*/tasks/*.yml"),
        *ROOT.glob("roles/*/defaults/*.yml"), *ROOT.glob("roles/*/templates/**/*.j2"),
        *ROOT.glob("ansible/*.yml"), *[p for p in ROOT.glob("scripts/*") if p.is_file()]]


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are data: docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            docs.add(id(node.body[0].value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _lines(path: Path) -> list[tuple[int, str]]:
    """A text file's lines less their comments (#, Jinja's {# #}) and a YAML task's name (what it
    says it does, as a comment does)."""
    out = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        body = re.sub(r"\{#.*?#\}", "", line)
        body = re.sub(r"(^|\s)#\s.*$", "", body)
        if (body.lstrip().startswith(("#", "//", "- name:", "name:")) and path.suffix == ".yml") \
                or body.lstrip().startswith(("#", "//")):
            continue
        out.append((i, body))
    return out


def _excepted(path: Path, what: str) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(fnmatch.fnmatch(rel, k.split(":")[0]) and k.endswith(f":{what}") for k in EXCEPTIONS)


def _found(text: str) -> list[str]:
    hits = [f"env {n}" for n in ENV_NAMES if re.search(rf"\b{n}\b", text)]
    hits += [f"cache part {m.group(0)}" for m in PART_PATH.finditer(text)]
    hits += [f"cache part {p}" for p in DISTINCT_PARTS
             if re.search(rf"(?<![\w-]){re.escape(p)}(?![\w-])", text)]
    return hits


def test_no_literal_of_the_contract_is_restated() -> None:
    found = []
    for path in CODE:
        if path == CONTRACT:
            continue
        for line, s in _strings(path):
            hits = [h for h in _found(s) if not (h.startswith("env") and _excepted(path, "env"))
                    and not (h.startswith("cache part") and _excepted(path, "parts"))]
            hits += [f"user {s}" for u in USERS if s == u]
            hits += [f"unit {s}" for u in ENABLED if s == u]
            found += [f"{path.relative_to(ROOT)}:{line}: {h}" for h in hits]
    for path in TEXT:
        for line, s in _lines(path):
            hits = _found(s)
            if not _excepted(path, "units"):
                hits += [f"unit {u}" for u in ENABLED if re.search(rf"(?<![\w@.-]){re.escape(u)}\b", s)]
            hits += [f"user {u}" for u in USERS if re.search(rf"(?<![\w-]){re.escape(u)}(?![\w-])", s)
                     and u != contract.SERVICE_USER]  # "inference" is every name's first word
            found += [f"{path.relative_to(ROOT)}:{line}: {h}" for h in hits]
    assert not found, "the contract restated (read it from inference_machine.contract or the " \
        "render instead):\n" + "\n".join(sorted(set(found)))


def test_the_render_writes_the_contract_whole() -> None:
    r = resolve("h100")
    doc = profile_document(r)
    assert doc["contract"] == json.loads(json.dumps(contract.as_data()))
    xv = ansible_vars(r)
    assert xv["inference_cache_parts"] == [c.name for c in contract.CACHE_PARTS]
    assert xv["inference_enabled_units"][-1] == "vllm@vllm-0.service"
    assert set(ENABLED) <= set(xv["inference_enabled_units"])


def test_every_fact_says_what_it_is() -> None:
    for c in contract.CACHE_PARTS:
        assert c.what and c.env
    for u in contract.UNITS:
        assert u.what
    src = CONTRACT.read_text()
    for field in contract.asdict(contract.ENV):
        assert re.search(rf"^    {field}: str = \"INFERENCE_[A-Z_]+\"  # \S", src, re.M), \
            f"ENV.{field} has no line saying what it is"
