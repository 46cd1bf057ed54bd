"""What a maintainer installs is what the code imports: every third-party module src/ imports is
declared in pyproject.toml (a dependency or an extra) and pinned in requirements.txt."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib

from conftest import ROOT

# import name -> distribution name, where they differ
DIST = {"yaml": "pyyaml", "prometheus_client": "prometheus-client"}
# imported only where vLLM runs (the GPU machine's lab, the stand-ins), never installed by setup
GPU_SIDE = {"vllm", "torch", "inference_image_vllm", "proof_stacks"}


def imported() -> set[str]:
    names: set[str] = set()
    for f in [*(ROOT / "src").rglob("*.py"), *(ROOT / "lab").rglob("*.py")]:
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Import):
                names |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                names.add(n.module.split(".")[0])
    return {m for m in names if m not in sys.stdlib_module_names
            and m not in ("inference_image", "inference_lab", "inference_machine", "__future__")}


def test_every_module_src_imports_is_declared_and_pinned() -> None:
    specs = []
    for pyproject in ("pyproject.toml", "lab/pyproject.toml"):
        project = tomllib.loads((ROOT / pyproject).read_text())["project"]
        specs += [*project["dependencies"],
                  *(d for extra in project.get("optional-dependencies", {}).values() for d in extra)]
    declared = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower() for d in specs}
    pinned = {ln.split("==")[0].split("[")[0].lower()
              for ln in (ROOT / "requirements.txt").read_text().splitlines()
              if "==" in ln and not ln.startswith("#")}
    wanted = {DIST.get(m, m) for m in imported() - GPU_SIDE}
    assert wanted, "no third-party import found: the scan is broken"
    assert wanted - declared == set(), f"imported, not in pyproject.toml: {wanted - declared}"
    assert wanted - pinned == set(), f"imported, not pinned in requirements.txt: {wanted - pinned}"


def test_the_gpu_proof_help_prints_the_proof_section() -> None:
    out = subprocess.run(["make", "-s", "gpu-proof-help"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("## 3. Run the proof"), out[:200]
    assert "inference-lab proof" in out and "## 4." not in out


def test_verify_knows_every_image_suite_by_its_file() -> None:
    """A suite is its file under image_tests/ (verify runs test_<suite>.py): no marker beside it."""
    from inference_image.ops.verify import SUITES
    files = {p.stem.removeprefix("test_") for p in (ROOT / "image_tests").glob("test_*.py")}
    assert set(SUITES) == files, set(SUITES) ^ files


def test_the_machine_s_runtime_needs_nothing_but_python_and_the_product_holds_no_lab() -> None:
    """machine/ is stdlib only (the image's runtime venv holds its wheel alone), the product's
    wheel is inference_image alone, and no code that ships edits sys.path."""
    machine = tomllib.loads((ROOT / "machine/pyproject.toml").read_text())["project"]
    assert machine["dependencies"] == []
    for f in (ROOT / "machine").rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            mods = [a.name for a in n.names] if isinstance(n, ast.Import) else (
                [n.module] if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module else [])
            for m in mods:
                assert m.split(".")[0] in sys.stdlib_module_names or m.startswith(
                    ("inference_machine", "vllm")), f"{f}: imports {m}"
    product = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert product["packages"]["find"]["include"] == ["inference_image*"]
    assert not (ROOT / "src" / "inference_lab").exists()
    shipped = [*(ROOT / "src").rglob("*.py"), *(ROOT / "machine").rglob("*.py"),
               *(ROOT / "plugins/vllm/inference_image_vllm").rglob("*.py")]
    edits = [str(f) for f in shipped if "sys.path.insert" in f.read_text()
             or "sys.path.append" in f.read_text()]
    assert edits == []


def test_no_template_holds_a_program() -> None:
    """Templates are configuration: a template that is a program (a shell or Python #! line; an
    nft ruleset is configuration) is glue of a few lines that calls one (the machine's runtime,
    the plugin), and no template runs an interpreter on a program in a string or heredoc."""
    templates = [*(ROOT / "templates").rglob("*.j2"), *(ROOT / "roles").glob("*/templates/**/*.j2")]
    assert templates
    for t in templates:
        text = t.read_text()
        if re.match(r"#!\S*(sh|bash|python[0-9.]*)\b", text):
            code = [ln for ln in text.splitlines()[1:] if ln.strip() and not ln.lstrip().startswith("#")]
            assert len(code) <= 15, f"{t}: {len(code)} lines of program"
        assert not re.search(r"python3? -c |<<'?PY|\bjq\b.*\|.*\bjq\b|\bawk '", text), t
