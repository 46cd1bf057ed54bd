"""inference-startup: the warm-cache bundle (made, installed, checked against the machine before
each start) and a start's anatomy from its log. Real files and tar archives in a scratch folder;
the machine key is given, as a machine of another GPU or driver would have it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import runtime

import inference_machine as startup
from inference_image.profiles import DIGEST_AT_DEFAULT, DIGEST_OMITS, resolve

STARTUP = [sys.executable, "-m", "inference_machine"]


def key(**change: str) -> dict[str, str]:
    k = {f: "x" for f in startup.KEY_FIELDS}
    k.update(gpu="NVIDIA H200", driver_major="580", vllm="0.26.0")
    k.update(change)
    return k


def a_cache(root: Path) -> Path:
    """A cache root as a start leaves it: compiled graphs, Triton kernels, a startup plan."""
    for rel, data in (("vllm/torch_compile_cache/abc/rank_0_0/backbone/graph.bin", b"g" * 5000),
                      ("vllm/startup_plan/startup_plan_1.json", b'{"kv": 1}'),
                      ("triton/K/kernel.cubin", b"\x7fELF" + b"k" * 100),
                      ("inductor/fx/entry", b"e")):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "tmp").mkdir()
    (root / "tmp" / "scratch").write_text("not part of a bundle")
    return root


def test_a_bundle_installed_on_a_machine_of_its_key_is_kept_and_vllm_finds_its_files(
        tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar.gz"
    m = startup.make(a_cache(tmp_path / "made"), bundle, key())
    assert sorted(m["files"]) == ["inductor/fx/entry", "triton/K/kernel.cubin",
                                  "vllm/startup_plan/startup_plan_1.json",
                                  "vllm/torch_compile_cache/abc/rank_0_0/backbone/graph.bin"]
    cache = tmp_path / "cache"
    (cache / "vllm").mkdir(parents=True)
    (cache / "vllm").chmod(0o750)  # as the build makes it
    (cache / "vllm" / "old").write_text("a cache of before")
    startup.install(bundle, cache)
    assert (cache / "vllm/torch_compile_cache/abc/rank_0_0/backbone/graph.bin").read_bytes() == \
        b"g" * 5000
    assert (cache / "vllm").stat().st_mode & 0o777 == 0o750 and not (cache / "vllm/old").exists()
    state, line = startup.check(cache, key())
    assert state == "bundle" and "matches this machine (NVIDIA H200, vLLM 0.26.0): 4 files" in line
    # a restart: the digests were read once, the sizes are checked again
    assert json.loads((cache / startup.MANIFEST).read_text())["verified_for"]
    assert startup.check(cache, key())[0] == "bundle"
    # installing the same bundle again changes nothing
    assert startup.install(bundle, cache).get("already") is True


@pytest.mark.parametrize(("field", "here"), [("gpu", "NVIDIA H100 80GB HBM3"),
                                              ("driver_major", "570"), ("vllm", "0.27.0"),
                                              ("profile_sha256", "other"), ("site", "/elsewhere")])
def test_a_bundle_of_another_machine_is_removed_with_why_and_the_start_compiles(
        tmp_path: Path, field: str, here: str) -> None:
    bundle = tmp_path / "b.tar.gz"
    startup.make(a_cache(tmp_path / "made"), bundle, key())
    cache = tmp_path / "cache"
    startup.install(bundle, cache)
    state, line = startup.check(cache, key(**{field: here}))
    assert state == "stale"
    assert f"{field} is {here!r} here, {key()[field]!r} in the bundle" in line
    assert line.endswith("The instance compiles as on a fresh machine")
    # what the bundle put there is gone; the folders the build made stay, for the start to fill
    assert not any(any((cache / p).iterdir()) for p in startup.CACHE_PARTS if (cache / p).is_dir())
    assert not (cache / startup.MANIFEST).exists()
    # the next start (the instance's own cache now) says so, and why the bundle went
    state, line = startup.check(cache, key(**{field: here}))
    assert state == "none" and "the last was not used" in line and field in line
    # a build run again does not install what a start here refused
    again = startup.install(bundle, cache)
    assert again.get("already") and field in again["rejected"]
    assert not (cache / startup.MANIFEST).exists()


@pytest.mark.parametrize("damage", ["truncated", "flipped", "missing", "manifest"])
def test_a_damaged_bundle_is_removed_and_the_start_goes_on(tmp_path: Path, damage: str) -> None:
    bundle = tmp_path / "b.tar.gz"
    startup.make(a_cache(tmp_path / "made"), bundle, key())
    cache = tmp_path / "cache"
    startup.install(bundle, cache)
    graph = cache / "vllm/torch_compile_cache/abc/rank_0_0/backbone/graph.bin"
    if damage == "truncated":
        graph.write_bytes(b"g" * 10)
    elif damage == "flipped":  # same size, other bytes: only the digest tells
        graph.write_bytes(b"h" * 5000)
    elif damage == "missing":
        graph.unlink()
    else:
        (cache / startup.MANIFEST).write_text("{not json")
    state, line = startup.check(cache, key())
    assert state == "corrupt", line
    assert not graph.exists()
    # the command a start runs says it in one line and exits 0, whatever it found
    proc = subprocess.run([*STARTUP, "check", "--cache", str(cache)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1, proc
    assert "no warm-cache bundle (the last was not used" in proc.stdout


def _tar(path: Path, manifest: dict | None, members: list[tarfile.TarInfo],
         data: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        if manifest is not None:
            raw = json.dumps(manifest).encode()
            info = tarfile.TarInfo(startup.MANIFEST)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
        for m in members:
            tar.addfile(m, io.BytesIO(data.get(m.name, b"")) if m.isreg() else None)
    return path


def _file(name: str, body: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = len(body)
    return info


@pytest.mark.parametrize("case", ["escape", "link", "unlisted", "digest", "no-manifest",
                                  "absolute", "other-part"])
def test_install_refuses_a_bundle_it_did_not_write_and_leaves_the_cache_as_it_was(
        tmp_path: Path, case: str) -> None:
    import hashlib
    body = b"payload"
    good = {"vllm/a": [len(body), hashlib.sha256(body).hexdigest()]}
    manifest = {"schema": 1, "key": key(), "files": good}
    members = [_file("vllm/a", body)]
    if case == "escape":
        manifest["files"] = {"vllm/../../x": good["vllm/a"]}
    elif case == "link":
        link = tarfile.TarInfo("vllm/b")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        members.append(link)
    elif case == "unlisted":
        members.append(_file("vllm/extra", b"x"))
    elif case == "digest":
        manifest["files"] = {"vllm/a": [len(body), "0" * 64]}
    elif case == "absolute":
        members = [_file("/tmp/evil", body)]
    elif case == "other-part":
        members = [_file("etc/cron.d/x", body)]
    bundle = _tar(tmp_path / "b.tar.gz", None if case == "no-manifest" else manifest, members,
                  {"vllm/a": body, "vllm/extra": b"x", "/tmp/evil": body, "etc/cron.d/x": body})
    cache = tmp_path / "cache"
    (cache / "vllm").mkdir(parents=True)
    (cache / "vllm" / "own").write_text("the instance's own cache")
    with pytest.raises(startup.BundleError) as exc:
        startup.install(bundle, cache)
    assert "\n" not in str(exc.value) and str(bundle) in str(exc.value)
    assert (cache / "vllm" / "own").read_text() == "the instance's own cache"
    assert not (cache / startup.MANIFEST).exists()
    assert sorted(p.name for p in cache.iterdir()) == ["vllm"]  # no stage left behind
    assert not (tmp_path / "x").exists() and not Path("/tmp/evil").exists()


def test_show_names_what_a_bundle_is_for_and_refuses_what_a_build_cannot_pass_on(
        tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar.gz"
    startup.make(a_cache(tmp_path / "made"), bundle, key())
    assert "on NVIDIA H200 (driver 580, vLLM 0.26.0" in startup.describe(bundle)
    for bad, why in ((tmp_path / "a b.tar.gz", "a path of letters"),
                     (tmp_path / "none.tar.gz", "not a file"),
                     (tmp_path / "made" / "inductor" / "fx" / "entry", "not a readable tar.gz")):
        with pytest.raises(startup.BundleError, match=why):
            startup.describe(bad)


def test_a_cache_warmed_by_the_build_is_sealed_in_place_and_checked_as_a_bundle(
        tmp_path: Path) -> None:
    """A build that served on the tier's own GPU seals what it compiled: each new machine's start
    keeps it where the key is that machine's and compiles afresh where it is not."""
    cache = a_cache(tmp_path / "cache")
    (cache / startup.REJECTED).write_text('{"why": "a bundle of before"}')
    # the command the build runs, keyed for this machine (no GPU here: "none")
    proc = subprocess.run([*STARTUP, "seal", "--cache", str(cache)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1, proc
    assert "sealed 4 files" in proc.stdout and not (cache / startup.REJECTED).exists()
    here = startup.machine_key(cache)
    m = json.loads((cache / startup.MANIFEST).read_text())
    assert m["key"] == here and "tmp/scratch" not in m["files"]  # not a cache part
    state, line = startup.check(cache, here)
    assert state == "bundle" and "matches this machine" in line, line
    # a second seal (a build run again) keeps the manifest the first wrote
    assert startup.seal(cache, key()).get("already") is True
    # the snapshot started on another GPU: the sealed cache goes, the start compiles
    state, line = startup.check(cache, {**here, "gpu": "NVIDIA H100 80GB HBM3"})
    assert state == "stale" and "gpu is 'NVIDIA H100 80GB HBM3' here" in line
    # nothing compiled (a build that did not serve): nothing sealed, one clear error
    with pytest.raises(startup.BundleError, match="no compiled state"):
        startup.seal(cache, key())
    assert not (cache / startup.MANIFEST).exists()
    # the build's command says so in one line and goes on (a start run eager compiles nothing)
    proc = subprocess.run([*STARTUP, "seal", "--cache", str(cache)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1, proc
    assert "no compiled state" in proc.stdout and "nothing sealed" in proc.stdout
    assert not (cache / startup.MANIFEST).exists()
    with pytest.raises(startup.BundleError, match="no cache here"):
        startup.seal(tmp_path / "none", key())


def test_the_runner_seals_with_the_key_its_units_start_checks(tmp_path: Path) -> None:
    """`inference-run --seal UNIT` (the build's task) reads the unit's environment as its start
    does: the key it seals with is the one that start's check computes."""
    import os

    from inference_image.render import render

    r = tmp_path / "render"
    render(resolve("h100"), r)
    cache = a_cache(tmp_path / "cache")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    env = {"PATH": os.environ["PATH"], "INFERENCE_ROOT": str(r), "INFERENCE_PYTHON": sys.executable,
           "INFERENCE_CACHE": str(cache), "MODEL_PATH": str(model)}
    run = subprocess.run([*runtime("inference-run"), "--seal", "vllm-0"],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and "sealed 4 files" in run.stdout, run
    sealed = json.loads((cache / startup.MANIFEST).read_text())["key"]
    assert sealed["model_config"] == startup.bundle.config_digest(str(model))
    assert sealed["profile_sha256"] != "none" and sealed["draft_config"] != "none"  # the unit's
    check = subprocess.run([*runtime("inference-startup"), "check",
                            "--cache", str(cache), "--profile-json",
                            str(r / "etc/inference-image/profile.json")],
                           env={**env, "DRAFT_PATH": "/var/lib/inference-image/models/"
                                "llama-3.1-8b-eagle3"},
                           capture_output=True, text=True, timeout=60, check=False)
    assert "matches this machine" in check.stdout, check


def test_an_installed_bundle_keeps_its_own_manifest_when_the_build_seals(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar.gz"
    made = startup.make(a_cache(tmp_path / "made"), bundle, key(gpu="given"))
    cache = tmp_path / "cache"
    startup.install(bundle, cache)
    (cache / "vllm" / "more-after-serving").write_text("x")
    sealed = startup.seal(cache, key())
    assert sealed.get("already") and sealed["key"] == made["key"]
    assert json.loads((cache / startup.MANIFEST).read_text())["key"]["gpu"] == "given"


def test_an_empty_cache_is_no_bundle(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    with pytest.raises(startup.BundleError, match="no compiled state"):
        startup.make(tmp_path, tmp_path / "b.tar.gz", key())
    assert not (tmp_path / "b.tar.gz").exists()


JOURNAL = """\
[  100.000000] h inference-run[7]: inference-startup: no warm-cache bundle
[  118.500000] h inference-run[7]: (APIServer pid=7) INFO 01-01 00:00:00 [api_utils.py:1] vLLM
[  138.000000] h inference-run[7]: (EngineCore pid=9) INFO Initializing a V1 LLM engine
[  141.500000] h inference-run[7]: (EngineCore pid=9) INFO Model loading took 9.00 GiB and 3.00 seconds
[  147.000000] h inference-run[7]: (EngineCore pid=9) INFO Dynamo bytecode transform time: 3.00 s
[  147.500000] h inference-run[7]: (EngineCore pid=9) INFO torch.compile took 5.00 s in total
[  148.000000] h inference-run[7]: (EngineCore pid=9) INFO torch.compile took 1.00 s in total
[  148.500000] h inference-run[7]: (EngineCore pid=9) INFO GPU KV cache size: 1,000,000 tokens
[  157.000000] h inference-run[7]: (EngineCore pid=9) INFO Graph capturing finished in 9 secs, took 2.00 GiB
[  158.000000] h inference-run[7]: (EngineCore pid=9) INFO init engine (profile, create kv cache, \
warmup model) took 16.00 s
[  161.000000] h inference-run[7]: (APIServer pid=7) INFO Application startup complete.
"""


def test_a_starts_phases_come_from_its_journal_in_the_order_it_passes_them() -> None:
    a = startup.anatomy(startup.journal_lines(JOURNAL, 100.0), ready_s=61.5, answered_s=61.6)
    assert a["phases"] == [["api_imports", 18.5], ["engine_process", 19.5], ["weights", 3.5],
                           ["compile", 6.5], ["kv_profile", 0.5], ["graph_capture", 8.5],
                           ["warmup", 1.0], ["api_startup", 3.0], ["health", 0.5],
                           ["first_answer", 0.1]]
    # the target's and the draft's compiles, summed
    assert a["reported"]["compile_s"] == 6.0 and a["reported"]["graph_capture_s"] == 9.0
    assert a["said"]["warm_cache"] == "inference-startup: no warm-cache bundle"
    proc = subprocess.run([*STARTUP, "phases", "--since-monotonic", "100",
                           "--ready-s", "61.5"], input=JOURNAL, capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(proc.stdout)["phases"][:2] == [["api_imports", 18.5],
                                                     ["engine_process", 19.5]]


def test_a_ready_measured_before_the_last_log_line_was_read_keeps_its_phases() -> None:
    """The lab reads a start's log on its own clock: under load the server's last line can be
    stamped after the ready it had already measured. The health and first-answer phases stay,
    at no time, and the start still adds up to its answer."""
    a = startup.anatomy(startup.journal_lines(JOURNAL, 100.0), ready_s=60.99, answered_s=61.0)
    names = [n for n, _ in a["phases"]]
    assert names[-3:] == ["api_startup", "health", "first_answer"], names
    assert a["phases"][-2:] == [["health", 0.0], ["first_answer", 0.0]]


def test_a_field_added_at_the_value_that_serves_as_before_keeps_the_profiles_digest() -> None:
    # h100x8 sets none of them: its digest is the one its records were made with
    before = resolve("h100x8").digest
    for path, default in DIGEST_AT_DEFAULT.items():
        value = "null" if default is None else str(default).lower()
        assert resolve("h100x8", overrides=[f"{path}={value}"]).digest == before
    for change in ("serving.engine_process=fork", "serving.page_cache_prefetch=true",
                   "serving.cudagraph_prefill_step=128"):
        assert resolve("h100x8", overrides=[change]).digest != before
    # what the image holds beside serving (DCGM's release, the firewall's cap) and how a start
    # builds the same kernels are in no digest, whatever their value
    values = {"versions.dcgm": ['"5"', "null"], "router.connections_per_address": ["0", "64"],
              "router.hold_s": ["0", "30"],
              "serving.parallel_compile": ["true", "false"],
              # true asks for a recorded kernel list, which h100x8 has none of
              "serving.triton_precompile": ["false"]}
    assert set(values) == DIGEST_OMITS
    for path, vals in values.items():
        for v in vals:
            assert resolve("h100x8", overrides=[f"{path}={v}"]).digest == before


def test_a_start_that_became_ready_is_recorded_in_endpoint_json_beside_what_firstboot_wrote(
        tmp_path: Path) -> None:
    endpoint = tmp_path / "endpoint.json"
    endpoint.write_text(json.dumps({"url": "https://10.0.0.2:8000", "model": "m"}))
    report = startup.ready_report(JOURNAL, 100.0, 161.6)
    assert report["s"] == 61.6 and report["phases"][0] == ["api_imports", 18.5]
    assert report["phases"][-1] == ["health", 0.6]
    assert report["warm_cache"] == "no warm-cache bundle"
    startup.record_ready(endpoint, "vllm-0", report)
    startup.record_ready(endpoint, "vllm-1", {**report, "s": 70.0})
    doc = json.loads(endpoint.read_text())
    assert doc["url"] == "https://10.0.0.2:8000" and set(doc["ready"]) == {"vllm-0", "vllm-1"}
    assert doc["ready"]["vllm-1"]["s"] == 70.0 and endpoint.stat().st_mode & 0o777 == 0o644


def test_the_banner_says_what_a_start_is_doing() -> None:
    lines = JOURNAL.splitlines()
    assert startup.doing("", 100.0, 103.0) == "importing Python, 3 s into its start"
    assert startup.doing("\n".join(lines[:4]), 100.0, 150.0) == \
        "compiling (torch.compile), 50 s into its start"
    assert startup.doing(JOURNAL, 100.0, 161.0).startswith("answering its health check")


def test_inspect_names_the_architectures_vllm_inspects_at_a_start(tmp_path: Path) -> None:
    """The build's inspection asks vLLM about what a start serves: the target's architectures and
    an EAGLE head's as vLLM 0.26 renames them (EAGLEConfig); a variable already set in the
    environment wins over the unit's file, as in inference-run."""
    target, head, other = tmp_path / "t", tmp_path / "h", tmp_path / "o"
    for folder, archs in ((target, ["LlamaForCausalLM"]), (head, ["LlamaForCausalLM"]),
                          (other, ["LlamaForCausalLMEagle3"])):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": archs}))
    env = tmp_path / "vllm-0.env"
    env.write_text(f"# a comment\nMODEL_PATH={target}\nDRAFT_PATH={head}\n")
    args = tmp_path / "vllm-0.args"
    args.write_text('--model\n${MODEL_PATH}\n--speculative-config\n'
                    '{"method":"eagle3","model":"${DRAFT_PATH}","num_speculative_tokens":3}\n')
    merged = startup.unit_environ(env)
    assert startup.architectures(merged, args) == ["LlamaForCausalLM", "Eagle3LlamaForCausalLM"]
    assert startup.architectures({**merged, "DRAFT_PATH": str(other)}, args) == [
        "LlamaForCausalLM", "LlamaForCausalLMEagle3"]  # a head named for EAGLE-3 keeps its name
    assert startup.architectures(merged, None) == ["LlamaForCausalLM"]  # no draft method: as is
    (head / "config.json").write_text("{not json")
    with pytest.raises(startup.BundleError, match=r"DRAFT_PATH=.*config\.json"):
        startup.architectures(merged, args)


def test_inspect_without_a_python_or_a_cache_root_says_which_is_missing(tmp_path: Path) -> None:
    env = tmp_path / "vllm-0.env"
    env.write_text("MODEL_PATH=/nowhere\n")
    proc = subprocess.run([*STARTUP, "inspect", "--env", str(env)],
                          capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"inference-startup: {env}: names no INFERENCE_PYTHON or "
                                   "VLLM_CACHE_ROOT")


def test_the_record_of_what_a_start_reads_lists_its_libraries_and_modules(tmp_path: Path) -> None:
    """The inspection's recording part, run by a real interpreter: the modules it imported (their
    compiled files, extension modules as they are) and the shared libraries it mapped; a module
    that is not there is skipped, not fatal, and so is a lazy module whose attributes import what
    is not installed (transformers' do: the cpu image has no torchvision)."""
    from inference_machine import prepare
    lazy = ("import sys, types\n"
            "class Lazy(types.ModuleType):\n"
            "    def __getattr__(self, name):\n"
            "        raise ModuleNotFoundError(\"No module named 'torchvision'\")\n"
            "sys.modules['lazy_like_transformers'] = Lazy('lazy_like_transformers')\n")
    script = (lazy + "sys.argv = ['inspect_in_vllm.py', '--names', 'json', 'ctypes', "
              "'no_such_module_here', 'lazy_like_transformers']\nimport runpy\n"
              f"runpy.run_path({str(prepare.INSPECT_SCRIPT)!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True,
                          check=True, timeout=60)
    reads = prepare.reads_from("a vLLM log line\n" + proc.stdout)
    assert reads is not None
    modules = [Path(m).name for m in reads["modules"]]
    assert any(m.startswith("_ctypes.") and ".so" in m for m in modules)
    assert any(m.startswith("decoder.") and m.endswith((".pyc", ".py")) for m in modules)
    assert any(Path(lib).name.startswith("libc.so") for lib in reads["libs"])
    assert not set(reads["libs"]) & set(reads["modules"])  # each file once
    assert prepare.reads_from("no such line") is None


def test_prefetch_reads_the_recorded_files_and_never_a_pipe(tmp_path: Path) -> None:
    """What the inspection recorded is read (sizes summed), the models' files asked for; a
    FIFO, a folder, a missing or relative path in the record are skipped, never read (a read
    of a FIFO would block the prefetch forever)."""
    import os

    from inference_machine import prepare
    lib, mod = tmp_path / "libx.so", tmp_path / "m.pyc"
    lib.write_bytes(b"L" * 3000)
    mod.write_bytes(b"M" * 200)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    model = tmp_path / "model"
    model.mkdir()
    (model / "w.safetensors").write_bytes(b"W" * 1000)
    reads = tmp_path / startup.READS
    reads.write_text(json.dumps({"libs": [str(lib), str(fifo), "relative.so", 7],
                                 "modules": [str(mod), str(tmp_path / "gone.pyc"),
                                             str(tmp_path)]}))
    assert startup.load_reads(reads) == ([str(lib), str(fifo)],
                                         [str(mod), str(tmp_path / "gone.pyc"), str(tmp_path)])
    assert startup.prefetch(reads, [model]) == (6, 3000 + 200 + 1000)
    assert startup.prefetch(None, []) == (0, 0)
    for bad, says in (("[1, 2]", "no list 'libs'"), ('{"libs": [], "modules": {}}',
                                                     "no list 'modules'"),
                      ("{oops", "not JSON")):
        reads.write_text(bad)
        with pytest.raises(startup.BundleError, match=says):
            startup.load_reads(reads)
    reads.write_bytes(b"[" * (prepare.READS_MAX_BYTES + 1))
    with pytest.raises(startup.BundleError, match="larger than"):
        startup.load_reads(reads)


def test_prefetch_command_reads_the_cache_roots_record_and_says_what_is_wrong_with_it(
        tmp_path: Path) -> None:
    """`inference-startup prefetch` as inference-run starts it: the record under
    INFERENCE_CACHE, then MODEL_PATH; a damaged record is one line and exit 1, no traceback."""
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"L" * 2048)
    (tmp_path / startup.READS).write_text(json.dumps({"libs": [str(lib)], "modules": []}))
    env = {"PATH": "/usr/bin:/bin", "INFERENCE_CACHE": str(tmp_path), "MODEL_PATH": "/nowhere"}
    run = [*STARTUP, "prefetch"]
    proc = subprocess.run(run, capture_output=True, text=True, check=False, env=env, timeout=60)
    assert proc.returncode == 0 and "read ahead 1 files" in proc.stdout, proc.stderr
    assert "no record" not in proc.stdout
    (tmp_path / startup.READS).write_text("{oops")
    proc = subprocess.run(run, capture_output=True, text=True, check=False, env=env, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("inference-startup: prefetch: ") and \
        len(proc.stderr.strip().splitlines()) == 1


def test_the_builds_inspection_outlives_a_bundle_installed_and_refused(tmp_path: Path) -> None:
    """vLLM's model inspections are the build's (`inspect`, valid on any GPU): no bundle
    carries them, installing a bundle keeps them, and a bundle refused as stale leaves them, so
    the start that compiles does not inspect each architecture again."""
    cache = a_cache(tmp_path / "cache")
    infos = cache / "vllm" / "modelinfos"
    infos.mkdir()
    (infos / "llama-abc.json").write_text('{"inspected": true}')
    bundle = tmp_path / "b.tar.gz"
    manifest = startup.make(cache, bundle, key())
    assert manifest["files"] and not [f for f in manifest["files"] if "modelinfos" in f]
    target = tmp_path / "machine"
    (target / "vllm" / "modelinfos").mkdir(parents=True)
    (target / "vllm" / "modelinfos" / "llama-abc.json").write_text('{"built": true}')
    (target / "vllm" / "old-graph").write_text("an earlier start's")
    startup.install(bundle, target)
    assert (target / "vllm" / "modelinfos" / "llama-abc.json").read_text() == '{"built": true}'
    assert not (target / "vllm" / "old-graph").exists()
    state, line = startup.check(target, key(gpu="NVIDIA L40S"))
    assert state == "stale" and "gpu" in line
    assert not (target / "vllm" / "torch_compile_cache").exists()
    assert (target / "vllm" / "modelinfos" / "llama-abc.json").read_text() == '{"built": true}'
