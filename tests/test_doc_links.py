"""Every relative link in README.md and docs/ names a file that exists and, where it names a
heading, a heading that file has (GitHub's anchors: lower case, punctuation dropped, spaces as
hyphens). A record's section in docs/benchmarks.md is linked as #run-N or #<record's stem>."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def anchors(page: Path) -> set[str]:
    out: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.*)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-"))
    return out


def test_anchor_rule_is_githubs() -> None:
    page = ROOT / "docs" / "decisions.md"
    assert "sealing-the-image" in anchors(page)
    assert "the-router-vllm-router-behind-nginx-round_robin-before-one-instance" in anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        link = m[1]
        if re.match(r"[a-z]+:", link):
            continue
        path, _, frag = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif frag and target.suffix == ".md" and frag not in anchors(target):
            broken.append(f"{link}: no such heading in {target.name}")
    assert not broken, broken


def test_every_evidence_link_in_profiles_and_code_resolves() -> None:
    """A setting's comment ends in a link to its evidence (`docs/tiers/<tier>.md#<setting>`):
    the page and the heading must exist, in profiles, templates, roles, src, plugins, the machine's
    runtime, the lab, scripts and the tests."""
    broken = []
    for folder in ("profiles", "templates", "roles", "src", "plugins", "packer", "machine", "lab",
                   "scripts", "image_tests", "tests"):
        for f in (ROOT / folder).rglob("*"):
            if (not f.is_file() or f.suffix in {".pyc", ".whl"} or "egg-info" in str(f)
                    or "/build/" in str(f) or "golden" in f.parts):
                continue
            try:
                text = f.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for m in re.finditer(r"docs/([\w/.-]+\.md)#([\w-]+)", text):
                page = ROOT / "docs" / m[1]
                if not page.is_file() or m[2] not in anchors(page):
                    broken.append(f"{f.relative_to(ROOT)}: {m[0]}")
    assert not broken, broken


def test_the_profile_reference_is_the_schemas_own() -> None:
    """docs/reference.md's profile fields are `inference-image profiles --fields`: every field of
    the schema, described (a field without a description fails here)."""
    from inference_image.schema import field_reference
    text = (ROOT / "docs/reference.md").read_text()
    block = text.split("<!-- profile-fields: begin -->\n", 1)[1].split("<!-- profile-fields: end -->")[0]
    assert block == field_reference(), "paste `inference-image profiles --fields` into docs/reference.md"
    undescribed = [ln.split("|")[1].strip() for ln in block.splitlines()[2:]
                   if not ln.rstrip(" |").rsplit("|", 1)[-1].strip()]
    assert undescribed == [], f"fields without a description: {undescribed}"
