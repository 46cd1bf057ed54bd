"""Every relative link in README.md and docs/ names a file that exists and, where it names a
heading, a heading that file has (GitHub's anchors: lower case, punctuation dropped, spaces as
hyphens). A record's section in docs/benchmarks.md is linked as #run-N or #<record's stem>."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import anchors

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


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


def test_the_references_layout_names_every_top_level_folder_and_package() -> None:
    """docs/reference.md#layout: a row for each folder the repository tracks at its top and for
    each Python package, so a reader learns where each runs."""
    import subprocess
    text = (ROOT / "docs/reference.md").read_text(encoding="utf-8")
    layout = text[text.index("## Layout\n"):]
    layout = layout[:layout.find("\n## ", 5) if "\n## " in layout[5:] else len(layout)]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    folders = {f.split("/", 1)[0] for f in tracked if "/" in f}
    packages = {str(p.parent.relative_to(ROOT)) for p in ROOT.glob("*/**/__init__.py")
                if not {"build", "tests", ".venv", "golden"} & set(p.relative_to(ROOT).parts)
                and ".egg" not in str(p) and "standin" not in p.parts}
    missing = sorted(f for f in folders | packages if f"`{f}/`" not in layout)
    assert not missing, f"docs/reference.md#layout names no row for: {missing}"
