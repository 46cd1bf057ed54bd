"""security: the API key is required on every route but /health; the instances, the router's own
port and the metrics ports are unreachable from outside; vLLM's dev mode is off; the services do
not run as root; the key is not visible to other users."""

from __future__ import annotations

import json
import shlex
import socket
import time
import urllib.parse
from typing import Any

import pytest
from conftest import HostKey, Public, http, tcp_open, wait_for

from inference_image.ops.bench import metric_samples
from inference_image.ops.observability import DCGM_PREFIX, dashboard_metrics, rules_metrics
from inference_image.render import EXPOSURE_CEILINGS, FIREWALL_TABLE

# Most checks need the stack serving; the ones on files, the firewall and the ports closed to the
# outside run on a build without its GPU too (the build validates every tier with this suite).

# Every route vLLM's OpenAI server and vllm-router expose (and one that exists nowhere): each must
# ask for the key on the public port. /metrics is included on purpose: metrics are scraped on the
# loopback ports (see /etc/inference-image/prometheus-targets.json), never without a key from outside.
ROUTES = [
    ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"), ("POST", "/v1/responses"), ("POST", "/tokenize"),
    ("POST", "/detokenize"), ("GET", "/metrics"), ("GET", "/version"), ("GET", "/get_server_info"),
    ("GET", "/server_info"), ("GET", "/ping"), ("POST", "/invocations"), ("POST", "/pooling"),
    ("POST", "/score"), ("POST", "/v1/score"), ("POST", "/rerank"), ("POST", "/v1/rerank"),
    ("POST", "/reset_prefix_cache"), ("POST", "/sleep"), ("POST", "/wake_up"),
    ("POST", "/collective_rpc"), ("POST", "/v1/load_lora_adapter"), ("GET", "/load"),
    ("GET", "/liveness"), ("GET", "/readiness"), ("GET", "/workers"), ("POST", "/flush_cache"),
    ("GET", "/no/such/route"),
]


@pytest.mark.serving
@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_key_required(root: Any, public: Public, method: str, path: str) -> None:
    body = {} if method == "POST" else None
    assert http(root, public, path, method=method, body=body).status == 401, "no key accepted"
    assert http(root, public, path, key="0" * 64, method=method, body=body).status == 401, \
        "a wrong key accepted"


# Routes of vllm-router and vLLM that are not OpenAI's: even the key does not reach them from
# outside (they clear caches, list workers, show internals).
INTERNAL = [("GET", "/workers"), ("POST", "/flush_cache"), ("GET", "/metrics"), ("POST", "/tokenize"),
            ("GET", "/get_server_info"), ("GET", "/list_workers"), ("POST", "/v1/load_lora_adapter")]


@pytest.mark.serving
@pytest.mark.parametrize(("method", "path"), INTERNAL, ids=[f"{m} {p}" for m, p in INTERNAL])
def test_internal_routes_not_public_even_with_the_key(root: Any, public: Public, api_key: HostKey,
                                                      method: str, path: str) -> None:
    body = "{}" if method == "POST" else None
    assert http(root, public, path, key=api_key, method=method, body=body).status == 404


@pytest.mark.serving
def test_health_needs_no_key(root: Any, public: Public) -> None:
    got = http(root, public, "/health")
    if got.status != 200:  # what the router and nginx said about it, for the report
        why = root.run("journalctl -u vllm-router.service -u nginx.service -n 25 --no-pager -o "
                       "short-precise; tail -5 /var/log/nginx/error.log").stdout
        pytest.fail(f"/health answered {got.status} {got.body.strip()}\n{why}")


@pytest.mark.serving
def test_right_key_accepted(root: Any, public: Public, api_key: HostKey) -> None:
    assert http(root, public, "/v1/models", key=api_key).status == 200


@pytest.mark.serving
def test_tls_unless_asked_otherwise(root: Any, profile: dict[str, Any], public: Public,
                                    api_key: HostKey) -> None:
    """The key crosses the network only inside TLS: the port speaks TLS with this machine's own
    certificate unless the profile or this machine's user-data chose plain HTTP."""
    chosen = root.file(profile["paths"]["tls_mode"])
    want = (chosen.content_string.strip() if chosen.exists else "") or profile["router"]["tls"]
    assert public.tls == (want != "off"), f"TLS chosen: {want}; endpoint.json says tls={public.tls}"
    if not public.tls:
        pytest.skip(f"plain HTTP chosen ({'user-data' if chosen.exists else 'profile'})")
    # verified against the machine's certificate (curl --cacert), never -k
    assert http(root, public, "/v1/models", key=api_key).status == 200
    plain = http(root, profile["router"]["port"], "/v1/models", key=api_key)
    assert plain.status == 400, f"plain HTTP on the TLS port gave {plain.status}"
    cert = root.run(f"openssl x509 -in {public.cacert} -noout -dates -fingerprint -sha256")
    assert cert.rc == 0, cert.stderr
    shown = root.file(profile["paths"]["endpoint"]).content_string
    assert cert.stdout.split("Fingerprint=")[1].strip() in shown, "endpoint.json shows another certificate"


@pytest.mark.serving
def test_rate_limit_answers_429(root: Any, profile: dict[str, Any], public: Public,
                                api_key: HostKey, load_here: None) -> None:
    """One address gets at most its burst plus the profile's rate over the time it sent for;
    beyond that 429 (JSON body, Retry-After), never a 5xx; a client under that is never limited;
    the machine's own loopback clients are not limited. The bound is set from the time the
    requests took, so a slow client (software emulation) is judged by what it sent, not by how
    fast a fixed number of requests was assumed to go."""
    rps, burst = profile["router"]["rate_limit_rps"], profile["router"]["rate_limit_burst"]
    if not rps:
        pytest.skip("the profile sets no rate limit (router.rate_limit_rps: 0)")
    addr = root.run("ip -4 -o addr show scope global").stdout.split()
    if len(addr) < 4:
        pytest.skip("the machine has no global address to send from")
    ip = addr[3].split("/")[0]  # from this address nginx sees a client off the loopback
    n = burst + 4 * rps + 50
    d = "/var/tmp/inference-image-ratelimit"
    # curl waits past nginx's own timer on a connection (handshake and headers): a connection that
    # is lost is nginx's doing, not the client's patience running out on a slow machine
    patience = profile["limits"]["client_header_timeout_s"] + 30

    def burst_from(url: str, extra: str, parallel: int = 64,
                   count: int = n) -> tuple[dict[str, int], float]:
        # Every request's outcome is counted, a failed one as curl's 000 with curl's exit status
        # (xargs then exits 123, which says only that one failed): the asserts below judge what
        # the client saw, and a failure names how the connection failed (000/exit N).
        out = root.run(
            f"rm -rf {d} && mkdir -p {d} && key={api_key.shell} && t0=$(date +%s.%N) && "
            f"{{ seq {count} | xargs -P {parallel} -I{{}} curl -s {public.curl} {extra} -o {d}/{{}}.body "
            f"-D {d}/{{}}.head -w '%{{http_code}} %{{exitcode}}\\n' -m {patience} "
            f"-H \"Authorization: Bearer $key\" {url} "
            f"> {d}/codes; true; }} && t1=$(date +%s.%N) && sort {d}/codes | uniq -c && "
            f"echo took $t0 $t1")
        lines = out.stdout.splitlines()
        assert lines and lines[-1].startswith("took "), f"the burst did not run: {out.stderr}"
        _, t0, t1 = lines[-1].split()
        codes: dict[str, int] = {}
        for k, c, e in (ln.split() for ln in lines[:-1]):
            key = c if c != "000" else f"000/exit {e}"
            codes[key] = codes.get(key, 0) + int(k)
        assert sum(codes.values()) == count, \
            f"{sum(codes.values())} outcomes of {count} requests: {codes}"
        return codes, float(t1) - float(t0)
    try:
        resolve = f"--resolve localhost:{public.port}:{ip}" if public.tls else ""
        codes, took = burst_from(public.url("/v1/models", "localhost" if public.tls else ip), resolve)
        # nginx's bucket: `burst` at once, then one request every 1/rps s; a second of slack for
        # the clock read around the requests and nginx's millisecond accounting
        admitted = burst + rps * (took + 1)
        sent_rate = f"{n} requests from {ip} in {took:.1f} s ({n / took:.0f}/s; limit {rps}/s, burst {burst})"
        assert codes.get("200", 0) <= admitted, f"more served than the limit admits: {codes}; {sent_rate}"
        assert not [c for c in codes if c.startswith(("5", "000"))], f"{codes}; {sent_rate}"
        if n > admitted:
            assert codes.get("429", 0) > 0, f"none limited: {codes}; {sent_rate}"
            assert codes.get("200", 0) >= burst, f"fewer than the burst served: {codes}; {sent_rate}"
        elif n < burst + rps * max(took - 1, 0):
            assert "429" not in codes, f"a client under the limit was limited: {codes}; {sent_rate}"
        if codes.get("429"):
            bodies = root.run(f"grep -l rate_limit_error {d}/*.body | wc -l").stdout.strip()
            heads = root.run(f"grep -il '^retry-after: 1' {d}/*.head | wc -l").stdout.strip()
            assert int(bodies) == int(heads) == codes["429"], \
                f"of {codes['429']} answers 429, {bodies} had the JSON error and {heads} Retry-After"
        local, _ = burst_from(public.url("/v1/models"), "")
        assert set(local) == {"200"}, f"loopback clients were limited: {local}"
        # 256 connections at once from one address: each answered (429 past the bucket), none
        # reset or dropped
        wide, took = burst_from(public.url("/v1/models", "localhost" if public.tls else ip),
                                resolve, parallel=256, count=max(n, 768))
        assert not [c for c in wide if c.startswith(("5", "000"))], \
            f"256 at once from {ip}: {wide} in {took:.1f} s"
    finally:
        root.run(f"rm -rf {d}")


def _behind_nat(addr: str) -> None:
    if addr.startswith("127."):
        pytest.skip(f"reached through a port forward on {addr} (qemu user networking): only forwarded "
                    "ports exist from here; the bound addresses and the firewall are checked on the machine")


@pytest.mark.serving
def test_public_port_reachable_from_outside(profile: dict[str, Any], outside_address: str) -> None:
    _behind_nat(outside_address)
    assert tcp_open(outside_address, profile["router"]["port"]), \
        f"{outside_address}:{profile['router']['port']} refuses connections"


def test_internal_ports_unreachable_from_outside(profile: dict[str, Any], outside_address: str) -> None:
    _behind_nat(outside_address)
    internal = [i["port"] for i in profile["instances"]]
    internal += [profile["router"]["internal_port"], profile["router"]["metrics_port"],
                 profile["limits"]["node_exporter_port"], profile["limits"]["status_exporter_port"]]
    open_ = [p for p in internal if tcp_open(outside_address, p, timeout=2)]
    assert not open_, f"reachable from outside on {outside_address}: {open_}"


def test_one_address_holds_at_most_its_connections(profile: dict[str, Any],
                                                   outside_address: str) -> None:
    """The firewall's per-address cap on the public ports, what bounds slow clients: from one
    address off the machine the cap's worth of connections stay open (sending nothing, as a slow
    client does), the next is reset at once, and once they close a new one gets in."""
    _behind_nat(outside_address)
    cap, port = profile["router"]["connections_per_address"], profile["router"]["port"]
    if not cap:
        pytest.skip("the profile sets no cap (router.connections_per_address: 0)")
    held: list[socket.socket] = []
    try:
        for _ in range(cap):
            held.append(socket.create_connection((outside_address, port), timeout=10))
        try:
            socket.create_connection((outside_address, port), timeout=10).close()
            over = "accepted"
        except ConnectionRefusedError:
            over = "reset"
        except OSError as e:
            over = f"{type(e).__name__}: {e}"
        assert over == "reset", f"connection {cap + 1} from {outside_address}: {over}, not reset"
    finally:
        for s in held:
            s.close()
    assert wait_for(lambda: tcp_open(outside_address, port), 30, 1), \
        f"{outside_address} still refused after closing its {cap} connections"


def test_firewall_denies_by_default(root: Any) -> None:
    rules = root.run(f"nft list chain inet {FIREWALL_TABLE} input")
    assert rules.rc == 0, f"no {FIREWALL_TABLE} input chain loaded"
    assert "policy drop" in rules.stdout


def _main_pid(root: Any, unit: str) -> tuple[str, str]:
    """(pid, user) of a unit's main process, from systemd (process titles change: vllm-router
    calls itself vllm::router)."""
    pid = root.run(f"systemctl show -p MainPID --value {unit}").stdout.strip()
    assert pid and pid != "0", f"{unit} has no main process"
    return pid, root.run(f"ps -o user:32= -p {pid}").stdout.strip()


def _units(profile: dict[str, Any]) -> list[str]:
    unit = profile["contract"]["unit"]
    return [unit["instance"].replace("@.", f"@{i['name']}.") for i in profile["instances"]] + \
        [unit["router"]]


def _checkpoints(profile: dict[str, Any]) -> bool:
    """serving.checkpoint: its take and restore need vLLM's dev routes (sleep, wake, collective_rpc),
    which the plugin's gate answers 403 to every request without the start's token."""
    return bool(profile["profile"]["serving"].get("checkpoint"))


def test_no_unit_sets_dev_mode(root: Any, profile: dict[str, Any]) -> None:
    units_dir = profile["paths"]["units"]
    setters = root.run(f"grep -rl VLLM_SERVER_DEV_MODE {units_dir}").stdout.split()
    if not _checkpoints(profile):
        assert setters == [], f"a unit file in {units_dir} sets VLLM_SERVER_DEV_MODE"
    for env in setters:  # only behind the gate
        args = root.run(f"cat {env.removesuffix('.env')}.args").stdout.splitlines()
        assert env.endswith(".env") and "inference_image_vllm.gate.Gate" in args, \
            f"{env} sets VLLM_SERVER_DEV_MODE without the checkpoint's gate in its args"


@pytest.mark.serving
def test_dev_mode_off(root: Any, profile: dict[str, Any]) -> None:
    gated = _checkpoints(profile)
    for unit in _units(profile):
        pid, _ = _main_pid(root, unit)
        env = root.run(f"tr '\\0' '\\n' < /proc/{pid}/environ")
        # Without CAP_SYS_PTRACE (a container) root cannot read another user's environment.
        if env.rc == 0 and not gated:
            assert "VLLM_SERVER_DEV_MODE=1" not in env.stdout, f"{unit} runs with VLLM_SERVER_DEV_MODE=1"
    # Dev-mode routes exist only with VLLM_SERVER_DEV_MODE=1, and then behind the gate.
    inst = profile["instances"][0]
    assert http(root, inst["port"], "/reset_prefix_cache", method="POST").status == (
        403 if gated else 404)


@pytest.mark.serving
def test_services_not_root(root: Any, profile: dict[str, Any]) -> None:
    for unit in _units(profile):
        user = profile["router_user"] if unit == profile["contract"]["unit"]["router"] \
            else profile["service_user"]
        pid, owner = _main_pid(root, unit)
        assert owner == user, f"{unit} (pid {pid}) runs as {owner}"
    workers = root.run("ps -o user= -C nginx").stdout.split()
    assert workers and set(workers) - {"root"}, "nginx has no unprivileged workers"


def test_the_router_cannot_touch_what_vllm_loads(root: Any, profile: dict[str, Any]) -> None:
    """vLLM loads compiled code from its caches: the router's user can neither write nor read
    them."""
    user, cache = profile["router_user"], profile["paths"]["cache"]
    assert root.run(f"id -u {user}").rc == 0, f"no user {user}"
    for sub in (c["name"] for c in profile["contract"]["cache_parts"]):
        assert root.run(f"runuser -u {user} -- test -w {cache}/{sub}").rc != 0, \
            f"{cache}/{sub} is writable by the router's user {user}"


def test_every_unit_is_at_or_under_its_exposure_ceiling(root: Any, profile: dict[str, Any]) -> None:
    """Each unit as systemd runs it here (drop-ins included), measured by `systemd-analyze
    security`, against the ceiling its sandbox was written to (render.EXPOSURE_CEILINGS)."""
    units = {f"vllm@{i['name']}.service": "vllm@" for i in profile["instances"]}
    units |= {f"{n}.service": n for n in EXPOSURE_CEILINGS if not n.endswith("@")}
    over = {}
    for unit, kind in units.items():
        out = root.run(f"systemd-analyze security --no-pager {shlex.quote(unit)} | tail -1")
        got = out.stdout.split(": ")[-1].split()[0] if ": " in out.stdout else ""
        assert got.replace(".", "", 1).isdigit(), f"{unit}: {out.stdout} {out.stderr}"
        if float(got) > EXPOSURE_CEILINGS[kind]:
            over[unit] = f"{got} > {EXPOSURE_CEILINGS[kind]}"
    assert not over, f"units over their exposure ceiling: {over}"


def test_api_key_private(root: Any, profile: dict[str, Any], api_key: HostKey) -> None:
    paths = profile["paths"]
    for path in (paths["api_key"], paths["api_key_map"], paths["scrape_token"],
                 paths["scrape_token_map"], paths["tls_key"]):
        f = root.file(path)
        assert f.user == "root" and f.mode & 0o077 == 0, f"{path} is {oct(f.mode)} {f.user}:{f.group}"
    key = root.file(api_key.path).content_string.strip()
    assert len(key) >= 32, "the API key is shorter than 32 characters"
    args = root.run("ps -eo args").stdout
    assert key not in args, "the API key is on a command line (visible to every user)"


@pytest.mark.serving
def test_metrics_are_scraped_with_the_scrape_token_and_nothing_else(
        root: Any, profile: dict[str, Any], public: Public, api_key: HostKey,
        scrape_targets: list[str]) -> None:
    """A remote Prometheus reads each of the machine's metrics targets (router.scrape) on the
    public port, /metrics/<target>, with the scrape token first boot made; without a token, or
    with the API key, it is refused, and the scrape token opens no API route."""
    gpu = ["gpu"] if profile["profile"]["hardware"]["gpu_count"] else []
    assert profile["router"]["scrape"] == [i["name"] for i in profile["instances"]] + [
        "router", "node", "nginx", *gpu], profile["router"]["scrape"]
    targets = scrape_targets
    token = HostKey(profile["paths"]["scrape_token"])
    assert root.file(token.path).content_string.strip() != \
        root.file(api_key.path).content_string.strip(), "the scrape token is the API key"
    for target in targets:
        got = http(root, public, f"/metrics/{target}", key=token)
        assert got.status == 200 and "# TYPE " in got.body, f"/metrics/{target}: {got.status} " \
            f"{got.body[:200]}"
        assert http(root, public, f"/metrics/{target}").status == 401
        assert http(root, public, f"/metrics/{target}", key=api_key).status == 401
    first = targets[0]
    assert "vllm:" in http(root, public, f"/metrics/{first}", key=token).body, \
        f"/metrics/{first} is not vLLM's"
    assert http(root, public, "/v1/models", key=token).status == 401, "the scrape token opened the API"
    assert http(root, public, "/metrics/no-such-target", key=token).status in (401, 404)


def _answers(root: Any, public: Public, token: HostKey, code: str) -> float:
    """The public port's answers of this status so far (/metrics/nginx)."""
    body = http(root, public, "/metrics/nginx", key=token).body
    return sum(v for name, labels, v in metric_samples(body)
               if name == "inference_http_responses_total" and labels.get("code") == code)


def _settled(root: Any, public: Public, token: HostKey, code: str) -> float:
    """That count once what nginx buffers (flushed every 2 s) has reached the log: the same
    twice, 3 s apart."""
    now = _answers(root, public, token, code)
    for _ in range(10):
        time.sleep(3)
        before, now = now, _answers(root, public, token, code)
        if now == before:
            return now
    raise AssertionError(f"the count of {code} answers never settled: {now}")


@pytest.mark.serving
def test_the_public_port_s_own_refusals_are_counted_by_status(
        root: Any, profile: dict[str, Any], public: Public, api_key: HostKey) -> None:
    """A request without the API key, which nginx refuses itself (no upstream counts it), shows
    as one more 401 in /metrics/nginx (mtail, from nginx's status line), and a scrape is not
    counted as an answer."""
    token = HostKey(profile["paths"]["scrape_token"])
    before = _settled(root, public, token, "401")
    assert http(root, public, "/v1/models").status == 401
    assert wait_for(lambda: _answers(root, public, token, "401") == before + 1, 15, every=0.5), \
        f"401s counted: {before} before, {_answers(root, public, token, '401')} after one more"
    ok = _settled(root, public, token, "200")
    for _ in range(3):
        assert http(root, public, "/metrics/node", key=token).status == 200
    assert _settled(root, public, token, "200") == ok, "scrapes are counted as answers"
    # the log mtail reads holds a status a line and nothing else of a request
    log = root.file(profile["paths"]["status_log"])
    assert log.user == "root" and log.mode == 0o644, f"{log.path}: {oct(log.mode)} {log.user}"
    lines = root.run(f"tail -n 1000 {log.path}").stdout.splitlines()
    assert lines and all(len(ln) == 3 and ln.isdigit() for ln in lines), lines[:5]


# what Prometheus makes itself for every target, served by none
PROMETHEUS_MADE = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


@pytest.mark.serving
def test_every_shipped_alert_rule_and_dashboard_panel_reads_metrics_the_machine_serves(
        root: Any, profile: dict[str, Any], public: Public, api_key: HostKey,
        scrape_targets: list[str]) -> None:
    """docs/operations/alerts.yml and dashboard.json against what this machine serves to a
    scraper: a rule or a panel on a metric no target exports would never fire or draw. One
    request first: vLLM's HTTP counters appear with the first request they count."""
    assert http(root, public, "/v1/models", key=api_key).status == 200
    token = HostKey(profile["paths"]["scrape_token"])
    served: set[str] = set()
    for target in scrape_targets:
        served |= {name for name, _, _ in
                   metric_samples(http(root, public, f"/metrics/{target}", key=token).body)}
    assert len(served) > 100, f"too few metrics read to judge: {sorted(served)[:20]}"
    wanted = {**rules_metrics(), **{f"panel {t}": m for t, m in dashboard_metrics().items()}}
    if "gpu" not in scrape_targets:  # no DCGM exporter (no GPU, or the lab's): its rules not judged
        wanted = {w: {m for m in names if not m.startswith(DCGM_PREFIX)}
                  for w, names in wanted.items()}
    missing = {what: sorted(names - served - PROMETHEUS_MADE)
               for what, names in wanted.items() if names - served - PROMETHEUS_MADE}
    assert not missing, f"rules or panels on metrics nobody serves: {missing}"


@pytest.mark.serving
def test_a_real_prometheus_scrapes_every_target_with_the_token_and_not_without(
        root: Any, profile: dict[str, Any], public: Public, outside_address: str,
        scrape_targets: list[str], tmp_path: Any) -> None:
    """Debian's Prometheus, where the tests run, scrapes the machine from outside as
    docs/operations.md says (the token and the certificate copied from it): every target up and
    vLLM's series stored; the same targets with a wrong token are down, refused (401)."""
    import shutil
    import socket
    import subprocess

    import yaml

    from inference_machine.bounded_http import fetch

    _behind_nat(outside_address)
    prom = shutil.which("prometheus")
    if prom is None:
        pytest.skip("no prometheus where the tests run (make deps installs Debian's)")
    paths = profile["paths"]
    (tmp_path / "token").write_text(root.file(paths["scrape_token"]).content_string.strip())
    (tmp_path / "wrong").write_text("0" * 64)
    (tmp_path / "cert.pem").write_text(root.file(paths["tls_cert"]).content_string)
    address = f"{outside_address}:{profile['router']['port']}"

    def job(name: str, token: str) -> dict[str, Any]:
        return {"job_name": name, "scheme": "https" if public.tls else "http",
                "scrape_interval": "1s", "scrape_timeout": "1s",
                "authorization": {"credentials_file": str(tmp_path / token)},
                **({"tls_config": {"ca_file": str(tmp_path / "cert.pem")}} if public.tls else {}),
                "static_configs": [{"targets": [address], "labels": {
                    "__metrics_path__": f"/metrics/{t}", "target": t,
                    **profile["contract"]["scrape_label"]}} for t in scrape_targets]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(
        {"scrape_configs": [job("inference-image", "token"), job("wrong-token", "wrong")]}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([prom, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        health: dict[tuple[str, str], tuple[str, str]] = {}
        end = time.monotonic() + 90
        while time.monotonic() < end:
            time.sleep(2)
            try:
                doc = json.loads(fetch(f"{api}/targets", deadline_s=5).body)
            except (OSError, ValueError):
                continue
            health = {(t["labels"]["job"], t["labels"]["target"]): (t["health"], t["lastError"])
                      for t in doc["data"]["activeTargets"]}
            if len(health) == 2 * len(scrape_targets) and \
                    "unknown" not in {h for h, _ in health.values()}:
                break
        up = {t: h for (j, t), h in health.items() if j == "inference-image"}
        refused = {t: h for (j, t), h in health.items() if j == "wrong-token"}
        assert up and all(h == "up" for h, _ in up.values()), f"not up: {up}"
        assert refused and all(h == "down" and "401" in err for h, err in refused.values()), \
            f"scraped with a wrong token: {refused}"
        q = json.loads(fetch(f"{api}/query?query=vllm:num_requests_running", deadline_s=5).body)
        assert q["data"]["result"], f"no vLLM series stored: {q}"
        # what the shipped alert rules and dashboard select: every target of this machine, up
        (label, value), = profile["contract"]["scrape_label"].items()
        selector = urllib.parse.quote(f'up{{{label}="{value}",job="inference-image"}}')
        q = json.loads(fetch(f"{api}/query?query={selector}", deadline_s=5).body)
        ups = {r["metric"]["target"]: r["value"][1] for r in q["data"]["result"]}
        assert ups == {t: "1" for t in scrape_targets}, ups
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


# ---- bad and hostile input at the public port ----------------------------------------------------

def _hostile_cases(profile: dict[str, Any]) -> dict[str, tuple[str, set[int]]]:
    """name -> (the request's curl arguments after the URL's path, accepted statuses)."""
    model, max_len = profile["served_model_name"], profile["profile"]["serving"]["max_model_len"]
    long_prompt = "hello " * (max_len + 200)  # more tokens than the model takes, in any tokenizer

    def data(obj: Any) -> str:
        return f"--data-binary {shlex.quote(json.dumps(obj))}"
    completions = "/v1/completions "
    return {
        "malformed JSON": (completions + "--data-binary '{\"model\": '", {400}),
        "not an object": ("/v1/chat/completions --data-binary '[1,2]'", {400, 422}),
        "unknown model": (completions + data({"model": "nope", "prompt": "x"}), {400, 404}),
        "prompt over max_model_len": (
            completions + data({"model": model, "prompt": long_prompt, "max_tokens": 4}), {400}),
        "max_tokens over max_model_len": (
            completions + data({"model": model, "prompt": "x", "max_tokens": max_len * 10}), {400}),
        "negative max_tokens": (
            completions + data({"model": model, "prompt": "x", "max_tokens": -1}), {400, 422}),
        "body over 64 MiB": (completions + "--data-binary @/var/tmp/inference-image-big.json", {413}),
    }


@pytest.mark.serving
def test_bad_requests_get_a_clear_4xx(root: Any, profile: dict[str, Any], public: Public,
                                      api_key: HostKey) -> None:
    """Each bad request gets its 4xx from nginx or vLLM (never a 5xx, a hang or a reset), and
    every instance is still healthy afterwards."""
    got = {}
    root.run("head -c 70000000 /dev/zero | tr '\\0' ' ' > /var/tmp/inference-image-big.json")
    try:
        for name, (args, want) in _hostile_cases(profile).items():
            out = root.run(
                f"curl -s {public.curl} -o /dev/null -w '%{{http_code}}' -m 60 "
                f"-H \"Authorization: Bearer \"{api_key.shell} -H 'Content-Type: application/json' "
                f"{public.url()}{args}")
            got[name] = (out.stdout.strip() or "000", want)
    finally:
        root.run("rm -f /var/tmp/inference-image-big.json")
    bad = {k: f"{c} (want {sorted(w)})" for k, (c, w) in got.items() if not c.isdigit() or int(c) not in w}
    assert not bad, f"bad requests answered wrongly: {bad}"
    for inst in profile["instances"]:
        assert http(root, inst["port"], "/health").status == 200, f"{inst['name']} unhealthy after"


SLOW_CLIENTS = r"""
import socket, ssl, sys, time
port, cafile, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
ctx = ssl.create_default_context(cafile=cafile) if cafile else None
socks = []
for _ in range(n):  # each sends half a request line, then nothing
    s = socket.create_connection(("127.0.0.1", port))
    if ctx:
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    socks.append(s)
t0 = time.monotonic()
for s in socks:
    s.settimeout(120)
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
print(f"closed_after_s {time.monotonic() - t0:.1f}")
"""


@pytest.mark.serving
def test_slow_clients_are_cut_off_and_cost_nobody_else(root: Any, profile: dict[str, Any],
                                                       public: Public, api_key: HostKey,
                                                       load_here: None) -> None:
    """Slow-loris: 200 connections that never finish their headers. A normal request still gets
    its answer meanwhile, and nginx closes the slow ones itself (client_header_timeout)."""
    py = root.run("command -v python3").stdout.strip()
    if not py:
        pytest.skip("no python3 on the machine to open the slow connections")
    script = "/var/tmp/inference-image-slow.py"
    root.run(f"cat > {script} <<'PY'\n{SLOW_CLIENTS}\nPY")
    cafile = public.cacert if public.tls else ""
    try:
        root.run(f"nohup {py} {script} {public.port} '{cafile}' 200 > {script}.out 2>&1 &")
        time.sleep(2)
        t0 = time.monotonic()
        assert http(root, public, "/v1/models", key=api_key, timeout=10).status == 200
        assert time.monotonic() - t0 < 5, "a normal request waited behind the slow clients"
        # nginx's header timer, started at each connection (opened before t0), plus slack for a
        # slow machine's clock and scheduling
        bound = profile["limits"]["client_header_timeout_s"] + 15
        done = wait_for(lambda: "closed_after_s" in root.run(f"cat {script}.out").stdout,
                        bound + 40, 2)
        out = root.run(f"cat {script}.out").stdout
        assert done, f"nginx kept the slow connections open for {bound + 40} s: {out[-300:]}"
        closed = float(out.split("closed_after_s")[1].split()[0])
        assert closed <= bound, f"slow connections held for {closed} s"
    finally:
        root.run(f"pkill -f {script}; rm -f {script} {script}.out")
