"""`make help` lists every target a user can run, under a group heading."""

from __future__ import annotations

import re
import subprocess

from conftest import ROOT


def test_make_help_lists_every_phony_target_in_a_group() -> None:
    text = (ROOT / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY:(.*?)(?<!\\)\n", text, re.M | re.S)[1].replace("\\\n", " ")
                .split())
    out = subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    listed = {m[1] for m in re.finditer(r"^  ([a-z0-9-]+) ", out, re.M)}
    assert phony - listed == set(), f"targets make help leaves out: {sorted(phony - listed)}"
    assert out.startswith("\nStart here\n  help "), out[:80]
    assert len(re.findall(r"^\S.*$", out, re.M)) >= 4  # group headings
