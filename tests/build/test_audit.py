"""The security audit's findings, each as behaviour: the build key cannot survive sysprep, the
first boot cannot leave a key and a map that disagree, hostile profile input is refused with one
line, the public port passes only the OpenAI routes, a dead engine is restarted, and a verify
run whose suite passed nothing fails."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT, runtime

from inference_image import cli
from inference_image.ops import verify
from inference_image.profiles import ProfileErrors, resolve
from inference_image.render import PATHS, render


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("render") / "h100"
    render(resolve("h100"), out)
    return out


# ---- 1. the build key ----------------------------------------------------------------------------

def test_sysprep_check_finds_the_key_in_nginx_map_too(tmp_path: Path) -> None:
    key, key_map = tmp_path / "api-key", tmp_path / "api-key.nginx"
    key_map.write_text('"Bearer 00ff" 1;\n')  # the map alone: what sysprep used to leave behind
    proc = subprocess.run(["bash", str(ROOT / "roles/sysprep/files/inference-sysprep-check")],
                          env={**os.environ, "SYSPREP_MACHINE_FILES": f"{key} {key_map}",
                               "SYSPREP_FORBIDDEN_FILE": ""},
                          capture_output=True, text=True, check=False)
    assert f"per-machine file left: {key_map}" in proc.stdout
    assert f"per-machine file left: {key}\n" not in proc.stdout
    assert proc.returncode == 1


def test_sysprep_check_finds_the_builds_downloads_where_render_puts_them(tmp_path: Path) -> None:
    """The build's staging folder (wheels, the hub CLI's home) is one path in PATHS: the roles
    stage under it, sysprep removes it, and the check is told it (it fails when not told)."""
    stage = tmp_path / "stage"
    (stage / "hf").mkdir(parents=True, exist_ok=True)
    check = ROOT / "roles/sysprep/files/inference-sysprep-check"
    env = {**os.environ, "SYSPREP_MACHINE_FILES": str(tmp_path / "none"), "SYSPREP_FORBIDDEN_FILE": ""}
    proc = subprocess.run(["bash", str(check)], env={**env, "SYSPREP_BUILD_STAGE": str(stage)},
                          capture_output=True, text=True, check=False)
    assert f"cache left: {stage}" in proc.stdout and proc.returncode == 1
    proc = subprocess.run(["bash", str(check)], env=env, capture_output=True, text=True, check=False)
    assert "SYSPREP_BUILD_STAGE is not set" in proc.stdout
    roles = {p: (ROOT / p).read_text() for p in (
        "roles/sysprep/tasks/main.yml", "roles/vllm/defaults/main.yml",
        "roles/python_venv/defaults/main.yml", "roles/models/defaults/main.yml")}
    roles["roles/inference_service/tasks"] = "".join(
        f.read_text() for f in sorted((ROOT / "roles/inference_service/tasks").glob("*.yml")))
    for path, text in roles.items():
        assert "inference_paths.build_stage" in text, path
        assert "/var/tmp/inference-image" not in text, f"{path} types a staging path again"


def test_sysprep_removes_both_key_files(h100: Path) -> None:
    extra = json.loads((h100 / "ansible/extra-vars.json").read_text())
    assert {PATHS["api_key"], PATHS["api_key_map"]} <= set(extra["sysprep_machine_files"])
    tasks = (ROOT / "roles/sysprep/tasks/main.yml").read_text()
    assert 'loop: "{{ sysprep_machine_files }}"' in tasks


# ---- 2. first boot -------------------------------------------------------------------------------

def _firstboot(h100: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*runtime("inference-firstboot", h100, root), *args],
                          env={**os.environ, "INFERENCE_ROOT": str(root)},
                          capture_output=True, text=True, check=False)


def _agree(root: Path) -> bool:
    key = (root / "etc/inference-image/api-key").read_text()
    return (root / "etc/inference-image/api-key.nginx").read_text() == f'"Bearer {key}" 1;\n'


def test_concurrent_first_boots_leave_a_key_and_map_that_agree(h100: Path, tmp_path: Path) -> None:
    for attempt in range(5):
        root = tmp_path / str(attempt)
        with ThreadPoolExecutor(8) as pool:
            runs = list(pool.map(lambda i, root=root: _firstboot(
                h100, root, *(["--force"] if i % 2 else [])), range(16)))
        assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs if r.returncode]
        assert _agree(root), f"attempt {attempt}: map and key disagree"


def test_every_boot_rewrites_a_stale_map(h100: Path, tmp_path: Path) -> None:
    assert _firstboot(h100, tmp_path).returncode == 0
    (tmp_path / "etc/inference-image/api-key.nginx").write_text('"Bearer stale" 1;\n')
    assert _firstboot(h100, tmp_path).returncode == 0
    assert _agree(tmp_path)


def test_firstboot_unit_runs_every_boot_after_cloud_init(h100: Path) -> None:
    unit = (h100 / "etc/systemd/system/inference-firstboot.service").read_text()
    assert re.search(r"^After=.*\bcloud-init\.service\b", unit, re.M)
    assert "ConditionPathExists" not in unit  # a condition skipped the map check on most boots


# ---- 4, 5. hostile profile input -----------------------------------------------------------------

BAD_SETS = [
    ("router.bind=; } server { listen 0.0.0.0:9999; }", "router.bind"),
    ("router.bind=", "router.bind"),
    ("router.bind=not-an-ip", "router.bind"),
    ('serving.extra_args=["--host", "0.0.0.0"]', "serving.extra_args.0"),
    ('serving.extra_args=["--max-model-len=1\\n--host=0.0.0.0"]', "serving.extra_args.0"),
    ('serving.extra_args=["--stream-interval", "4"]', "serving.extra_args.0"),
    ("serving.stream_interval=0", "serving.stream_interval"),
    ('digitalocean.region=tor1"\nx = "y', "digitalocean.region"),
    ("versions.vllm=0.26.0 --index-url http://example.invalid/simple", "versions.vllm"),
    ("serving.base_port=65534", "serving.base_port"),
    ("targets.output_tok_s=.inf", "targets.output_tok_s"),
    ("hardware.gpu_memory_gib=.inf", "hardware.gpu_memory_gib"),
]


@pytest.mark.parametrize(("override", "field"), BAD_SETS, ids=[f for _, f in BAD_SETS])
def test_hostile_field_is_refused_with_one_clear_line(override: str, field: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["validate", "h100x8", "--set", override])
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert any(f": {field}: " in ln and "Fix:" in ln for ln in lines), err


def test_ipv6_bind_renders_a_valid_listen_line(tmp_path: Path) -> None:
    render(resolve("h100", overrides=["router.bind='::'"]), tmp_path / "r")
    root = tmp_path / "root"
    assert _firstboot(tmp_path / "r", root).returncode == 0
    listen = (root / PATHS["public_listen"].lstrip("/")).read_text()
    assert "listen [::]:8000 ssl " in listen


def test_gpu_count_must_match_the_droplet_size() -> None:
    with pytest.raises(ProfileErrors) as exc:
        resolve("h100", overrides=["hardware.gpu_count=16", "serving.instances=16"])
    assert any(e.field == "hardware.gpu_count" and "gpu-h100x1-80gb has 1" in e.message
               for e in exc.value.errors)


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    d.mkdir()
    for f in (ROOT / "profiles").glob("*.yaml"):
        (d / f.name).write_text(f.read_text())
    return d


def _refused(pdir: Path, tier: str, text: str | bytes, capsys: pytest.CaptureFixture[str]) -> str:
    path = pdir / f"{tier}.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    t0 = time.monotonic()
    rc = cli.main(["--profiles-dir", str(pdir), "validate", tier])
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and took < 10, (rc, took, err[-300:])
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_anchor_bomb_is_refused_at_once(pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    err = _refused(pdir, "bomb", "\n".join(lines) + "\n", capsys)
    assert "aliases" in err


def test_deep_nesting_is_refused_without_a_traceback(pdir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(pdir, "deep", "a: " + "[" * 5000 + "]" * 5000 + "\n", capsys)
    assert "nested deeper" in err


def test_extends_cannot_leave_the_profiles_directory(pdir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "outside.yaml").write_text("tier: x\n")
    err = _refused(pdir, "escape", "extends: ../outside.yaml\n", capsys)
    assert "extends" in err and "not a profile file beside this one" in err


def test_profile_that_is_not_utf8_is_one_line(pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(pdir, "latin", b"tier: caf\xe9\n", capsys)
    assert "not UTF-8" in err


# ---- 6. only the OpenAI routes reach the router --------------------------------------------------

def test_public_port_passes_only_openai_routes(h100: Path) -> None:
    conf = (h100 / "etc/nginx/conf.d/inference-image.conf").read_text()
    proxied = [m.group(1) for m in re.finditer(r"location ~ (\S+) \{", conf)]
    assert len(proxied) == 1
    route = re.compile(proxied[0])
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models",
                 "/v1/models/llama-3.1-8b-instruct", "/v1/embeddings"):
        assert route.match(path), path
    for path in ("/workers", "/flush_cache", "/metrics", "/tokenize", "/v1/load_lora_adapter",
                 "/v1/../workers", "/get_server_info", "/v1/score"):
        assert not route.match(path), path
    catch_all = conf[conf.index("location / {"):conf.index("location ~")]
    assert "return 404" in catch_all and "proxy_pass" not in catch_all


def test_router_restart_falls_back_to_the_instances(h100: Path) -> None:
    conf = (h100 / "etc/nginx/conf.d/inference-image.conf").read_text()
    upstream = conf[conf.index("upstream inference_router {"):]
    upstream = upstream[:upstream.index("}")]
    assert "server 127.0.0.1:8001 max_fails=0;" in upstream
    assert "server 127.0.0.1:8100 backup max_fails=0;" in upstream
    assert "proxy_next_upstream error timeout http_500 http_502 http_503 non_idempotent;" in conf


# ---- 7. a dead engine comes back -----------------------------------------------------------------

def test_instances_restart_whatever_their_exit_code(h100: Path) -> None:
    unit = (h100 / "etc/systemd/system/vllm@.service").read_text()
    assert re.search(r"^Restart=always$", unit, re.M)  # vLLM can exit 0 when its engine dies
    assert re.search(r"^StartLimitIntervalSec=0$", unit, re.M)


def test_nginx_the_public_entry_point_restarts_too(h100: Path) -> None:
    dropin = (h100 / "etc/systemd/system/nginx.service.d/inference-image.conf").read_text()
    assert re.search(r"^Restart=always$", dropin, re.M)


# ---- 9. a suite that passed nothing fails --------------------------------------------------------

def _junit(tmp_path: Path, cases: str) -> Path:
    p = tmp_path / "junit.xml"
    p.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return p


def test_verify_fails_when_a_suite_passed_nothing(tmp_path: Path) -> None:
    cases = ('<testcase classname="test_smoke" name="a"/>'
             '<testcase classname="test_hygiene" name="b"><skipped message="no image.json"/></testcase>')
    table, ok = verify.summarize(_junit(tmp_path, cases))
    assert not ok
    assert "hygiene: nothing passed (1 skipped: no image.json)" in table
    table, ok = verify.summarize(_junit(tmp_path, '<testcase classname="test_smoke" name="a"/>'))
    assert ok
