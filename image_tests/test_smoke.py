"""smoke: the stack is up and serves: units active and enabled, router and every instance
healthy, ports bound where they should be, model cache present, compile cache writable."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from conftest import HostKey, Public, http, traffic_per_instance, wait_for, why_not_serving


def units(profile: dict[str, Any]) -> list[str]:
    """The stack and the units on the request path (the contract's, as the render wrote it)."""
    unit = profile["contract"]["unit"]
    return ([unit["stack"], unit["router"], unit["public"]]
            + [unit["instance"].replace("@.", f"@{i['name']}.") for i in profile["instances"]])


def test_units_enabled_and_active(root: Any, profile: dict[str, Any], request: pytest.FixtureRequest) -> None:
    serving = not request.config.getoption("--no-serving")
    firstboot = profile["contract"]["unit"]["firstboot"]
    bad = []
    for u in [*units(profile), firstboot]:
        s = root.service(u)
        if not s.is_enabled:
            bad.append(f"{u} not enabled")
        if serving and u != firstboot and not s.is_running:
            bad.append(f"{u} not active")
    assert not bad, "; ".join(bad)


def test_every_unit_on_the_request_path_restarts(root: Any, profile: dict[str, Any]) -> None:
    """nginx, the router and each instance come back by themselves, whatever ended them (vLLM can
    exit 0 when its engine dies; Debian's nginx unit does not restart at all)."""
    policy = {u: root.run(f"systemctl show -p Restart --value {u}").stdout.strip()
              for u in units(profile)[1:]}
    assert all(p == "always" for p in policy.values()), policy


@pytest.mark.serving
def test_every_instance_healthy(root: Any, profile: dict[str, Any]) -> None:
    problems = [p for p in (why_not_serving(root, i) for i in profile["instances"]) if p]
    if problems:
        pytest.fail("; ".join(problems))


@pytest.mark.serving
def test_router_answers(root: Any, profile: dict[str, Any], public: Public) -> None:
    rt = profile["router"]
    # the router's view of an instance that has just come up lags by its health checks: it gets
    # a few rounds of them, as a client's retry would
    got = wait_for(lambda: (r := http(root, rt["internal_port"], "/health")).status == 200 and r,
                   timeout=4 * profile["profile"]["router"]["health_check_interval_secs"] + 10)
    assert got, f"vllm-router's own /health: {http(root, rt['internal_port'], '/health')}"
    assert http(root, public, "/health").status == 200, "/health on the public port (nginx)"


@pytest.mark.serving
def test_router_lists_the_model(root: Any, profile: dict[str, Any], api_key: HostKey,
                                public: Public) -> None:
    r = http(root, public, "/v1/models", key=api_key)
    assert r.status == 200, r.body
    ids = [m["id"] for m in r.json()["data"]]
    assert profile["served_model_name"] in ids


@pytest.mark.serving
def test_chat_completion_through_router(root: Any, profile: dict[str, Any], api_key: HostKey,
                                       public: Public) -> None:
    body = {"model": profile["served_model_name"], "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "Say something about GPUs."}]}
    r = http(root, public, "/v1/chat/completions", key=api_key, method="POST", body=body)
    assert r.status == 200, r.body
    d = r.json()
    assert d["usage"]["completion_tokens"] > 0
    assert d["choices"][0]["message"]["content"] is not None


@pytest.mark.serving
@pytest.mark.parametrize("sampling", [
    {},  # what most clients send: the checkpoint's generation_config decides (Llama: top_p 0.9)
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.0, "top_k": 40}])
def test_sampled_requests_answer_and_leave_the_instances_up(
        root: Any, profile: dict[str, Any], api_key: HostKey, public: Public,
        sampling: dict[str, float]) -> None:
    """vLLM 0.26 filters top-p and top-k with FlashInfer on NVIDIA GPUs unless told not to, and
    FlashInfer builds that kernel with nvcc, which no image has: the engine did not start on the
    GPU machine, its own warm-up of that sampler failing
    (docs/decisions.md#no-cuda-compiler-in-the-image-vllms-own-top-p-sampler-and-proof-servers-that-see-no-nvcc).
    Here every kind of request is answered and every instance still serves after it."""
    body = {"model": profile["served_model_name"], "max_tokens": 16, **sampling,
            "messages": [{"role": "user", "content": "Name a prime number."}]}
    r = http(root, public, "/v1/chat/completions", key=api_key, method="POST", body=body)
    assert r.status == 200, r.body
    assert r.json()["usage"]["completion_tokens"] > 0
    problems = [p for p in (why_not_serving(root, i) for i in profile["instances"]) if p]
    assert not problems, "; ".join(problems)


@pytest.mark.serving
def test_router_spreads_requests_over_instances(root: Any, profile: dict[str, Any],
                                                api_key: HostKey, public: Public) -> None:
    if len(profile["instances"]) < 2:
        pytest.skip("one instance")
    delta = traffic_per_instance(root, profile, api_key, public, 12)
    assert sum(delta.values()) >= 12, f"requests served per instance: {delta}"
    assert all(v > 0 for v in delta.values()), f"an instance served nothing: {delta}"


@pytest.mark.serving
def test_ports_bound_where_they_should_be(root: Any, profile: dict[str, Any]) -> None:
    out = root.run("ss -Hltn").stdout.split("\n")
    bound: dict[int, set[str]] = {}
    for line in out:
        parts = line.split()
        if len(parts) >= 4:
            addr, _, port = parts[3].rpartition(":")
            bound.setdefault(int(port), set()).add(addr.strip("[]"))
    rt = profile["router"]
    loopback = {i["name"]: i["port"] for i in profile["instances"]}
    loopback |= {"router": rt["internal_port"], "router metrics": rt["metrics_port"],
                 "node exporter": profile["limits"]["node_exporter_port"],
                 "mtail (the public port's answers)": profile["limits"]["status_exporter_port"]}
    for what, port in loopback.items():
        assert bound.get(port) == {"127.0.0.1"}, f"{what} (port {port}) bound to {bound.get(port)}"

    bind = profile["profile"]["router"]["bind"]
    assert bind in bound.get(rt["port"], set()), f"public port {rt['port']} bound to {bound.get(rt['port'])}"


@pytest.mark.serving
def test_public_port_is_held_for_nginx(root: Any, profile: dict[str, Any]) -> None:
    """nginx.socket holds the public port and nginx serves on that one socket (inherited, none of
    its own), so a killed nginx leaves the port open: the faults suite counts the requests."""
    port = profile["router"]["port"]
    assert root.run("systemctl is-active nginx.socket").stdout.strip() == "active"
    lines = root.run(f"ss -Hltnp 'sport = :{port}'").stdout.strip().splitlines()
    assert len(lines) == 1, f"port {port}: one listening socket expected: {lines}"
    assert '"systemd"' in lines[0] and '"nginx"' in lines[0], lines[0]


def test_model_cache_present(root: Any, profile: dict[str, Any]) -> None:
    for m in profile["models"]:
        assert root.file(f"{m['path']}/config.json").is_file, f"{m['name']}: no config.json in {m['path']}"
        # a weightless stand-in (scripts/make-test-model: a GPU tier built without hub access)
        # says so in its folder and in version-info; every other model brings weights
        standin = root.file(f"{m['path']}/.make-test-model").exists
        if not m["local_config"] and not standin:
            weights = root.run(f"ls {m['path']} | grep -c '\\.safetensors$'").stdout.strip()
            assert int(weights or 0) > 0, f"{m['name']}: no weights in {m['path']}"


def test_compile_cache_writable_by_the_service(root: Any, profile: dict[str, Any]) -> None:
    user, cache = profile["service_user"], profile["paths"]["cache"]
    for sub in (c["name"] for c in profile["contract"]["cache_parts"]):
        r = root.run(f"runuser -u {user} -- test -w {cache}/{sub}")
        assert r.rc == 0, f"{cache}/{sub} is not writable by {user}"


def test_the_build_inspected_the_models_so_no_start_does(root: Any, profile: dict[str, Any]) -> None:
    """The build ran `inference-startup inspect`: vLLM's answers about the served architectures
    are in its cache, current for the installed vLLM (asking again writes nothing), and owned by
    the instances' user. It also recorded what a start reads (the shared libraries and modules
    vLLM's import takes), the list serving.page_cache_prefetch reads ahead, for that user."""
    units, inst = profile["paths"]["units"], profile["instances"][0]["name"]
    reads = f"{profile['paths']['cache']}/start-reads.json"
    f = root.file(reads)
    assert f.is_file and f.user == profile["service_user"], f"{reads}: missing or not theirs"
    doc = json.loads(f.content_string)
    assert any("/torch/" in p for p in doc["libs"]), "no torch library in the record"
    assert any("/vllm/" in p for p in doc["modules"]), "no vLLM module in the record"
    r = root.run(f"{profile['paths']['startup']} inspect --env {units}/{inst}.env "
                 f"--args {units}/{inst}.args")
    assert r.rc == 0, r.stderr
    assert r.stdout.startswith("inference-startup: already inspected: "), r.stdout
    assert "recorded what a start reads" in r.stdout, r.stdout
    infos = f"{profile['paths']['cache']}/vllm/modelinfos"
    assert root.run(f"find {infos} -name '*.json' | grep -q .").rc == 0, f"nothing in {infos}"
    foreign = root.run(f"find {infos} ! -user {profile['service_user']}").stdout.strip()
    assert not foreign, f"not the instances' user's: {foreign}"


def test_what_a_start_imports_has_its_bytecode(root: Any, profile: dict[str, Any]) -> None:
    """pip writes each module's bytecode when the build installs vLLM: the build's record of what
    a start reads names the cached bytecode of every module in the vLLM venv, never a bare source
    a start would compile again each time (docs/decisions.md#ready-time)."""
    doc = json.loads(root.file(f"{profile['paths']['cache']}/start-reads.json").content_string)
    venv = profile["paths"]["vllm_venv"].rstrip("/")
    ours = [p for p in doc["modules"] if p.startswith(venv + "/")]
    assert any(p.endswith(".pyc") for p in ours), "no bytecode recorded under the vLLM venv"
    # a lazy module (transformers' packages) is recorded by its source, having no __cached__: its
    # bytecode is looked for where the venv's Python would look
    sources = [p for p in ours if p.endswith(".py")][:500]
    r = root.run(f"{venv}/bin/python -c "
                 + shlex.quote("import importlib.util as u, os, sys; print('\\n'.join(p for p in "
                               "sys.argv[1:] if not os.path.isfile(u.cache_from_source(p))))")
                 + "".join(f" {shlex.quote(p)}" for p in sources))
    assert r.rc == 0, r.stderr
    bare = r.stdout.split()
    assert not bare, f"{len(bare)} of {len(ours)} modules without bytecode, e.g. {bare[:5]}"


@pytest.mark.serving
def test_every_start_checked_the_warm_cache_and_said_what_it_found(
        root: Any, profile: dict[str, Any]) -> None:
    """inference-run checks a warm-cache bundle before each start (one journal line). A bundle the
    build installed is either kept (the line says it matches) or gone, with why in the journal and
    in warm-cache.rejected.json: the molecule build installs one keyed for another machine."""
    cache = profile["paths"]["cache"]
    said = ""
    for inst in profile["instances"]:
        r = root.run(f"journalctl -u vllm@{inst['name']}.service --no-pager -o cat")
        lines = [x for x in r.stdout.splitlines() if x.startswith("inference-startup: ")]
        assert lines, f"vllm@{inst['name']} started without the warm-cache check"
        said += "\n".join(lines)
    installed, rejected = root.file(f"{cache}/warm-cache.json"), root.file(
        f"{cache}/warm-cache.rejected.json")
    if installed.exists:
        assert "matches this machine" in said, said
    if rejected.exists:
        doc = json.loads(rejected.content_string)
        assert doc["state"] in ("stale", "corrupt") and doc["why"] in said, (doc, said)
        assert not installed.exists


@pytest.mark.serving
def test_every_instance_says_when_it_became_ready_and_where_its_start_went(
        root: Any, profile: dict[str, Any]) -> None:
    """Each start, once it answers, logs its phases and records them in endpoint.json
    (vllm@'s ExecStartPost: inference-startup ready)."""
    endpoint = json.loads(root.file(profile["paths"]["endpoint"]).content_string)
    for inst in profile["instances"]:
        rep = (endpoint.get("ready") or {}).get(inst["name"])
        assert rep and rep["s"] > 0 and rep["phases"], (inst["name"], endpoint)
        # the phases, read from vLLM's log, add up to the time to ready
        assert rep["phases"][-1][0] == "health", rep
        assert abs(sum(sec for _, sec in rep["phases"]) - rep["s"]) < 0.5, rep
        r = root.run(f"journalctl -u vllm@{inst['name']}.service --no-pager -o cat")
        assert f"inference-startup: {inst['name']}: ready after " in r.stdout


@pytest.mark.serving
def test_the_login_banner_says_where_the_api_is_and_that_it_serves(
        root: Any, profile: dict[str, Any]) -> None:
    """pam_motd's script prints endpoint.json's address, key path and certificate, and the first
    instance's state with its time to ready, as a user logging in reads it."""
    endpoint = json.loads(root.file(profile["paths"]["endpoint"]).content_string)
    first = profile["instances"][0]["name"]
    r = root.run("/etc/update-motd.d/90-inference-image")
    assert r.rc == 0, r.stderr
    assert f"OpenAI-compatible API at {endpoint['url']}/v1" in r.stdout, r.stdout
    assert f"API key:  sudo cat {endpoint['api_key']}" in r.stdout, r.stdout
    took = endpoint["ready"][first]["s"]
    assert f"{endpoint['model']}, serving (ready {took} s after its start)" in r.stdout, r.stdout
    if endpoint["tls"] not in ("off", "acme"):
        assert f"SHA-256 {endpoint['tls_sha256']}" in r.stdout, r.stdout


def test_vllm_plugin_registered(root: Any, profile: dict[str, Any]) -> None:
    # Installed on every tier, inert unless a unit sets INFERENCE_IMAGE_FP8_DISPATCH=1.
    py = f"{profile['paths']['vllm_venv']}/bin/python"
    r = root.run(f"{py} -c \"import importlib.metadata as m; "
                 f"print(*(e.value for e in m.entry_points(group='vllm.general_plugins')))\"")
    assert r.rc == 0, r.stderr
    assert "inference_image_vllm:register" in r.stdout.split(), \
        f"the project's vLLM plugin is not registered in {py}: {r.stdout!r}"
    env = root.run(f"cat {profile['paths']['units']}/*.env").stdout
    assert ("INFERENCE_IMAGE_FP8_DISPATCH=1" in env) == bool(
        profile["profile"]["serving"].get("fp8_gemm_dispatch")), "unit env and profile disagree"
    n = profile["profile"]["serving"].get("triton_decode_max_tokens") or 0
    assert (f"INFERENCE_IMAGE_TRITON_DECODE_TOKENS={n}" in env) == bool(n), \
        "unit env and profile disagree on serving.triton_decode_max_tokens"
    assert ("INFERENCE_IMAGE_TRITON_DECODE_VERIFY=1" in env) == bool(
        profile["profile"]["serving"].get("triton_decode_verify")), \
        "unit env and profile disagree on serving.triton_decode_verify"
    assert ("INFERENCE_IMAGE_EARLY_FIRST_TOKEN=1" in env) == bool(
        profile["profile"]["serving"].get("early_first_token")), \
        "unit env and profile disagree on serving.early_first_token"
    assert ("INFERENCE_IMAGE_DECODE_GRAPHS=1" in env) == (
        profile["profile"]["serving"].get("cudagraph_mode") == "full_and_decode"), \
        "unit env and profile disagree on serving.cudagraph_mode"


def test_the_machine_s_programs_are_its_runtime_s_wheel(root: Any, profile: dict[str, Any]) -> None:
    """The programs the units run are console scripts of one installed wheel (inference-machine,
    in a virtualenv of the system's Python), linked where the render names them."""
    paths = profile["paths"]
    r = root.run(f"{paths['runtime_venv']}/bin/pip show inference-machine")
    assert r.rc == 0, r.stderr
    fields = dict(ln.split(": ", 1) for ln in r.stdout.splitlines() if ": " in ln)
    assert fields.get("Name") == "inference-machine" and fields.get("Version"), r.stdout
    for program in profile["runtime_programs"]:
        link = root.file(program)
        assert link.is_symlink and link.linked_to == \
            f"{paths['runtime_venv']}/bin/{program.rsplit('/', 1)[1]}", program
    assert not root.file("/usr/local/lib/inference-image").exists
