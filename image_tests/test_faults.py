"""faults: steady load through the public port while one process of the request path is killed
(SIGKILL): an instance, the router, nginx; then the whole stack restarted (`systemctl restart
inference.target`). For each: requests sent, failed (by status), how long until the endpoint
answered again; then every unit must be back, every instance healthy and taking traffic. Last,
the machine rebooted under load from clients off it: a podman container is restarted from this
side (`podman restart`, as the molecule scenario's first boot does); any other host reboots
itself (`systemctl reboot`).

It disrupts a serving machine, so `inference-image verify` runs it only when asked
(`--suite faults`); `make faults` runs it on the cpu tier's first boot in the molecule container."""

from __future__ import annotations

import json
import re
import shlex
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

import pytest
from conftest import (
    HostKey,
    Public,
    http,
    own_router_worker_fleet,
    seconds_until_balanced,
    traffic_per_instance,
    unit_failure_cause,
    wait_for,
    why_not_serving,
)

from inference_image.ops.cause import CPU_NO_MEMORY
from inference_machine import contract

pytestmark = pytest.mark.serving

LOAD_S = 20          # seconds of load per fault
KILL_AFTER_S = 5     # the fault comes this long into the load
WORKERS = 4
NGINX_BACK_S = 5     # nginx restarts in about a second: five is a public port that heals
BALANCED_S = 120     # vllm-router takes a failed instance back ~60 s after its failure


def _under_load(root: Any, profile: dict[str, Any], api_key: HostKey, public: Public, fault: str,
                load_s: int = LOAD_S, goes_down: bool = False) -> dict[str, Any]:
    """One script on the machine: load through the public port, the fault, the wait for an
    answer, the counts. A client that gets an error waits a tenth of a second before its next
    request, as a client with back-off would (the count is of requests, not of a tight loop's spins).

    goes_down: a fault queued with --no-block takes effect later; "back" then counts only once
    the endpoint has stopped answering (within 60 s, else back_s stays None), or a poll that
    beats the stop reads the old stack as back (a restart whose clients then got hundreds of
    503 answers read as back within a second)."""
    body = json.dumps({"model": profile["served_model_name"], "prompt": "hello", "max_tokens": 4,
                       "temperature": 0})
    script = f"""
set -u
dir=$(mktemp -d /var/tmp/inference-image-faults.XXXXXX)
key=$(cat {shlex.quote(api_key.path)})
end=$((SECONDS + {load_s}))
models_ok() {{ [ "$(curl -s {public.curl} -o /dev/null -w '%{{http_code}}' -m 1 \\
  -H "Authorization: Bearer $key" {public.url('/v1/models')})" = 200 ]; }}
for w in $(seq {WORKERS}); do
  ( while [ $SECONDS -lt $end ]; do
      code=$(curl -s {public.curl} -o /dev/null -w '%{{http_code}}' -m 60 -H "Authorization: Bearer $key" \\
        -H 'Content-Type: application/json' --data-binary {shlex.quote(body)} \\
        {public.url('/v1/completions')})
      echo "$code" >> "$dir/w$w"
      [ "$code" = 200 ] || sleep 0.1
    done ) &
done
sleep {KILL_AFTER_S}
t0=$(date +%s%N)
{fault}
down=1
{"down=0" if goes_down else ":"}
while [ $down = 0 ] && [ $(( ($(date +%s%N) - t0) / 1000000000 )) -lt 60 ]; do
  models_ok || down=1
  [ $down = 1 ] || sleep 0.05
done
if [ $down = 1 ]; then
  until models_ok; do sleep 0.1; done
  t1=$(date +%s%N)
fi
wait
if [ $down = 1 ]; then echo "back_ms $(( (t1 - t0) / 1000000 ))"; else echo never_down; fi
cat "$dir"/w* | sort | uniq -c | sed 's/^/code /'
rm -rf "$dir"
"""
    out = root.run(f"timeout {load_s + 600} bash -c {shlex.quote(script)}")
    assert out.rc == 0, f"load script failed ({out.rc}): {out.stderr[-500:]}"
    codes: Counter[str] = Counter()
    back_s = None
    for line in out.stdout.splitlines():
        f = line.split()
        if f[0] == "back_ms":
            back_s = int(f[1]) / 1000
        elif f[0] == "code":
            codes[f[2]] += int(f[1])
    return {"sent": sum(codes.values()), "failed": {c: n for c, n in codes.items() if c != "200"},
            "back_s": back_s}


def _units(profile: dict[str, Any]) -> list[str]:
    unit = profile["contract"]["unit"]
    return ([unit["router"], unit["public"]]
            + [unit["instance"].replace("@.", f"@{i['name']}.") for i in profile["instances"]])


def _all_back(root: Any, profile: dict[str, Any], timeout: float = 300) -> None:
    units = _units(profile)

    def healthy(port: int) -> bool:  # a refused connection is "not yet", not an error
        out = root.run(f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 http://127.0.0.1:{port}/health")
        return out.stdout.strip() == "200"

    def ready() -> bool:
        return (all(root.service(u).is_running for u in units)
                and all(healthy(i["port"]) for i in profile["instances"]))
    assert wait_for(ready, timeout=timeout, every=3), f"not every unit came back: {units}"


def _fault(root: Any, profile: dict[str, Any], api_key: HostKey, public: Public, fault: str,
           record_property: Any, back_within: float = 300, load_s: int = LOAD_S,
           goes_down: bool = False) -> dict[str, Any]:
    _all_back(root, profile)  # a fault test starts from a whole stack
    res = _under_load(root, profile, api_key, public, fault, load_s, goes_down)
    _all_back(root, profile, back_within)
    _balanced(root, profile, api_key, public, res)
    for k, v in res.items():
        record_property(k, v)
    print(f"fault {fault!r}: {res}")
    assert res["sent"] > 0, "no request was sent"
    return res


def _balanced(root: Any, profile: dict[str, Any], api_key: HostKey, public: Public,
              res: dict[str, Any]) -> None:
    """Every instance takes traffic again, and how long after the stack was whole it did."""
    if len(profile["instances"]) < 2:
        return
    res["balanced_after_s"] = seconds_until_balanced(root, profile, api_key, public, BALANCED_S)
    assert res["balanced_after_s"] is not None, \
        f"an instance took no traffic for {BALANCED_S} s after the fault: {res}"


def test_instance_killed_under_load(root: Any, profile: dict[str, Any], api_key: HostKey,
                                    public: Public, record_property: Any) -> None:
    unit = f"vllm@{profile['instances'][0]['name']}.service"
    res = _fault(root, profile, api_key, public, f"systemctl kill -s KILL {unit}", record_property)
    assert not res["failed"], f"requests failed while an instance was down: {res}"


def test_router_killed_under_load(root: Any, profile: dict[str, Any], api_key: HostKey,
                                  public: Public, record_property: Any) -> None:
    res = _fault(root, profile, api_key, public, "systemctl kill -s KILL vllm-router.service",
                 record_property)
    assert not res["failed"], f"requests failed while the router restarted: {res}"
    assert res["back_s"] is not None and res["back_s"] <= 5, res


@pytest.mark.parametrize("whom", ["all", "main"])
def test_nginx_killed_under_load(root: Any, profile: dict[str, Any], api_key: HostKey,
                                 public: Public, record_property: Any, whom: str) -> None:
    """nginx killed whole (every process of the unit) or its master alone. The public port is
    nginx.socket's: while systemd starts nginx again, new connections wait in its queue and are
    served after, so none is refused. What can be lost is a request in flight at the kill (at most
    one a client): killed whole, its worker is gone; its master alone, the workers are told to
    finish (QUIT) and are killed after the unit's TimeoutStopSec, so an answer longer than that is
    cut."""
    res = _fault(root, profile, api_key, public,
                 f"systemctl kill --kill-whom={whom} -s KILL nginx.service", record_property)
    lost = sum(res["failed"].values())
    assert set(res["failed"]) <= {"000"} and lost <= WORKERS, \
        f"more failed than the {WORKERS} clients had in flight when nginx was killed: {res}"
    if res["back_s"] is None or res["back_s"] > NGINX_BACK_S:
        journal = root.run("journalctl -u nginx.service --since -120s -o short-precise --no-pager "
                           "| tail -25").stdout
        pytest.fail(f"nginx back after {res['back_s']} s (target {NGINX_BACK_S}): {res}\n{journal}")


def test_journald_killed_under_load(root: Any, profile: dict[str, Any], api_key: HostKey,
                                   public: Public, record_property: Any) -> None:
    """Every service logs to journald through its stdout. journald killed (a crash, or the OOM
    killer on a full machine) must cost no request, and what the services write afterwards must
    reach the journal again: a service whose log stream broke would lose its logs silently, or
    stop on its next write."""
    journald = "systemd-journald.service"
    started = root.run(f"systemctl show -p ExecMainStartTimestampMonotonic --value {journald}")
    res = _fault(root, profile, api_key, public, f"systemctl kill -s KILL {journald}",
                 record_property)
    assert not res["failed"], f"requests failed while journald restarted: {res}"
    assert root.service(journald).is_running, "journald did not come back"
    restarted = root.run(f"systemctl show -p ExecMainStartTimestampMonotonic --value {journald}")
    assert restarted.stdout.strip() != started.stdout.strip(), "journald was not restarted"
    since = root.run(f"systemctl show -p ActiveEnterTimestamp --value {journald}").stdout.strip()
    # vLLM logs its engine's stats every 10 s while it serves: the load after the kill ran 15 s
    inst = f"vllm@{profile['instances'][0]['name']}.service"
    lines = root.run(f"journalctl -u {inst} --since {shlex.quote(since)} -o cat --no-pager").stdout
    record_property("instance_lines_after", len(lines.splitlines()))
    assert lines.strip(), f"nothing from {inst} reached the journal after journald restarted"


def test_stack_restarted_under_load(root: Any, profile: dict[str, Any], api_key: HostKey,
                                    public: Public, record_property: Any) -> None:
    """`systemctl restart inference.target` (what a changed unit file or a user asks for) stops
    every instance at once: requests sent while nothing serves get a 503 with Retry-After, the
    ones in flight when their instance stopped are cut (at most one per client; there is no
    drain), and the whole stack is back and balanced without a person."""
    res = _fault(root, profile, api_key, public, "systemctl restart --no-block inference.target",
                 record_property, back_within=profile["limits"]["start_timeout_s"],
                 load_s=LOAD_S, goes_down=True)
    assert res["back_s"] is not None, f"the endpoint never stopped answering: {res}"
    assert set(res["failed"]) <= {"503", "000"}, f"failures other than 503 while restarting: {res}"
    assert res["failed"].get("000", 0) <= WORKERS, f"more cut requests than were in flight: {res}"



def test_logs_that_cannot_be_written(root: Any, profile: dict[str, Any], api_key: HostKey,
                                     public: Public, record_property: Any) -> None:
    """A full /var/log: nginx's error log (its only log file: access logging is off) writes to
    /dev/full, which fails every write with ENOSPC as a full disk does, and nginx reopens it;
    then under load an instance is restarted. Serving must not depend on a log: nothing fails
    that would not fail on a healthy machine, and the restarted instance comes back."""
    if len(profile["instances"]) < 2:
        pytest.skip("one instance: its restart would stop the endpoint, logs or not")
    log = "/var/log/nginx/error.log"
    inst = profile["instances"][0]["name"]
    try:
        root.run(f"mv -f {log} {log}.faults 2>/dev/null; ln -sfn /dev/full {log} && "
                 "systemctl reload nginx.service")
        assert root.run(f"echo x >> {log}").rc != 0, "the log is still writable"
        res = _fault(root, profile, api_key, public,
                     f"systemctl restart --no-block vllm@{inst}.service", record_property)
    finally:
        root.run(f"rm -f {log} && mv -f {log}.faults {log} 2>/dev/null; "
                 "systemctl reload nginx.service")
    assert res["back_s"] is not None and res["back_s"] <= NGINX_BACK_S, res
    # one instance restarting while the other serves: at most the requests it had in flight
    assert sum(res["failed"].values()) <= WORKERS and set(res["failed"]) <= {"000", "502",
                                                                               "503"}, res


# A fault that keeps one instance from starting, as a runtime drop-in (gone at the next boot):
# the cache part a start's temporary files go to (the contract's)
TMP = next(c for c in contract.CACHE_PARTS if c.env == "TMPDIR")
# (the drop-in's [Service] lines, what its journal line must name, whether only the cpu tier has it)
CANNOT_START = {
    # a KV cache of 1 PB: vLLM cannot allocate it (GPU tiers: the GPU machine's own proof)
    "memory": ("Environment=" + "=".join(CPU_NO_MEMORY), r"memory|allocat", True),
    # the instance's temporary and cache files on a disk with too little room ({small})
    "disk-full": (f"Environment={TMP.env}={{small}}/{TMP.name}", r"No space left", False),
}
SMALL_FS = "/run/inference-image-small-disk"


def _small_disk(root: Any, profile: dict[str, Any]) -> str | None:
    """A directory on a file system with less free space than an instance needs: a 1 MiB tmpfs
    where this machine lets root mount one, else /dev where it is that small (a podman
    container's /dev is a 64 MiB tmpfs, and mounting is not allowed there)."""
    need = profile["limits"]["min_cache_free_mib"]
    if root.run(f"mkdir -p {SMALL_FS} && mount -t tmpfs -o size=1m,mode=1777 tmpfs {SMALL_FS}").rc == 0:
        return SMALL_FS
    free = root.run("df -Pm /dev | awk 'NR == 2 { print $4 }'").stdout.strip()
    if free.isdigit() and int(free) < need:
        d = "/dev/inference-image-small-disk"
        root.run(f"mkdir -p {d} && chmod 1777 {d}")
        return d
    return None


@pytest.mark.parametrize("fault", list(CANNOT_START))
def test_instance_that_cannot_start(root: Any, profile: dict[str, Any], api_key: HostKey,
                                    public: Public, record_property: Any, fault: str) -> None:
    """One instance cannot start (no memory for its KV cache; a full disk under its caches): its
    journal says why in one line, the smoke suite (what verify runs) names that line, systemd
    keeps retrying it, and the public port serves on the others meanwhile."""
    lines, why, cpu_only = CANNOT_START[fault]
    if cpu_only and profile["profile"].get("hardware", {}).get("gpu_count"):
        pytest.skip(f"{fault}: the GPU variant runs on a GPU machine")
    if len(profile["instances"]) < 2:
        pytest.skip("one instance: nothing would serve while it fails")
    inst = profile["instances"][-1]
    unit = f"vllm@{inst['name']}.service"
    dropin = f"/run/systemd/system/{unit}.d"
    _all_back(root, profile)
    small = _small_disk(root, profile) if "{small}" in lines else ""
    if small is None:
        pytest.skip("no file system small enough to stand for a full disk on this machine")
    since = root.run("date +@%s").stdout.strip()
    try:
        conf = "[Service]\\n" + lines.format(small=small) + "\\n"
        root.run(f"mkdir -p {dropin} && printf '{conf}' > {dropin}/90-fault.conf && "
                 f"systemctl daemon-reload && systemctl restart --no-block {unit}")
        # the old process's shutdown logs errors of its own first: wait for the new start's cause
        wait_for(lambda: re.search(why, unit_failure_cause(root, unit, since) or "", re.I),
                 timeout=300, every=3)
        cause = unit_failure_cause(root, unit, since)
        assert cause, f"{unit} failed without a line in its journal that says why"
        record_property("cause", cause)
        print(f"fault {fault}: {unit}: {cause}")
        assert re.search(why, cause, re.I), f"the cause does not name {fault}: {cause}"
        problem = why_not_serving(root, inst)  # what the smoke suite reports
        assert problem and re.search(why, problem, re.I), problem
        served = [http(root, public, "/v1/models", key=api_key).status for _ in range(10)]
        spread = traffic_per_instance(root, profile, api_key, public, 8)
        assert spread[inst["name"]] == 0 and sum(spread.values()) >= 8, spread
        assert served == [200] * 10, served
        restarts = root.run(f"systemctl show -p NRestarts --value {unit}").stdout.strip()
        assert wait_for(lambda: int(root.run(f"systemctl show -p NRestarts --value {unit}")
                                    .stdout.strip() or 0) > int(restarts or 0), 120, 3), \
            f"systemd stopped retrying {unit}"
    finally:
        root.run(f"rm -rf {dropin} && systemctl daemon-reload && systemctl restart --no-block {unit}")
        if small:
            root.run(f"umount {SMALL_FS} 2>/dev/null; rm -rf {small}")
    _all_back(root, profile)


HUNG_START_S = 45  # the test's start timeout: the image's own is limits.start_timeout_s


def test_instance_hung_in_its_start(root: Any, profile: dict[str, Any], api_key: HostKey,
                                    public: Public, record_property: Any) -> None:
    """An instance whose start hangs (its processes stopped before /health answers, as the fleet
    proof's start hung on a shared memory block) is killed at the unit's start timeout and started
    again without a person: the unit is Type=notify, started only once /health answers. The
    public port serves on the others meanwhile."""
    if len(profile["instances"]) < 2:
        pytest.skip("one instance: nothing would serve while it hangs")
    inst = profile["instances"][-1]
    unit = f"vllm@{inst['name']}.service"
    dropin = f"/run/systemd/system/{unit}.d"

    def show(prop: str) -> str:
        return root.run(f"systemctl show -p {prop} --value {unit}").stdout.strip()

    _all_back(root, profile)
    since = root.run("date +@%s").stdout.strip()
    try:
        root.run(f"mkdir -p {dropin} && printf '[Service]\\nTimeoutStartSec={HUNG_START_S}\\n' "
                 f"> {dropin}/90-hung.conf && systemctl daemon-reload && "
                 f"systemctl restart --no-block {unit}")
        assert wait_for(lambda: show("ActiveState") == "activating" and show("MainPID") != "0",
                        timeout=60, every=0.5), f"{unit} did not start again: {show('ActiveState')}"
        restarts = int(show("NRestarts") or 0)  # a restart asked for resets systemd's count
        # every process of the unit, the readiness helper included: a start where nothing moves
        assert root.run(f"systemctl kill -s STOP {unit}").rc == 0
        t0 = time.monotonic()
        assert show("ActiveState") == "activating", "the start was over before it was stopped"
        served = [http(root, public, "/v1/models", key=api_key).status for _ in range(10)]
        assert served == [200] * 10, served
        assert wait_for(lambda: int(show("NRestarts") or 0) > restarts,
                        timeout=HUNG_START_S + 90, every=2), \
            f"{unit} hung in its start and was not started again ({show('ActiveState')})"
        record_property("restarted_after_s", round(time.monotonic() - t0, 1))
    finally:
        # the next start runs under the unit's own timeout (a reload re-arms the running one)
        root.run(f"rm -rf {dropin} && systemctl daemon-reload")
    journal = root.run(f"journalctl -u {unit} --since {since} -o cat --no-pager").stdout
    assert re.search(r"start operation timed out", journal, re.I), journal[-2000:]
    _all_back(root, profile)


def test_fleet_worker_instance_stopped_under_load(root: Any, profile: dict[str, Any],
                                                 api_key: HostKey, public: Public,
                                                 record_property: Any) -> None:
    """A fleet worker stopping an instance (a shutdown, a restart) under load: its unit's ExecStop
    has the router remove it, then waits for what it serves to finish before vLLM's SIGTERM, so
    no request is cut. The machine's own vllm-router stands in for the fleet's (a real one of the
    same version, as in test_fleet.py); afterwards the fleet file goes, the instance starts again
    on loopback and the router has it back."""
    if len(profile["instances"]) < 2:
        pytest.skip("one instance: nothing would serve while it is stopped")
    paths, rt = profile["paths"], profile["router"]
    inst = profile["instances"][-1]
    unit, url = f"vllm@{inst['name']}.service", f"http://127.0.0.1:{inst['port']}"
    fleet = own_router_worker_fleet(profile)
    assert not root.file(paths["fleet"]).exists, "this machine already has a fleet file"
    _all_back(root, profile)
    since = root.run("date +@%s").stdout.strip()
    try:
        root.run_test(f"printf %s {shlex.quote(json.dumps(fleet))} > {paths['fleet']}")
        res = _under_load(root, profile, api_key, public, f"systemctl stop {unit}")
    finally:
        root.run(f"rm -f {paths['fleet']}")
        root.run(f"systemctl start --no-block {unit}")
    for k, v in res.items():
        record_property(k, v)
    journal = root.run(f"journalctl -u {unit} --since {since} -o cat --no-pager").stdout
    left = re.search(rf"{re.escape(url)} left .*; draining", journal)
    drained = re.search(rf"{re.escape(url)} drained in (\d+) s", journal)
    assert left and drained, journal[-2000:]
    record_property("drained_in_s", int(drained.group(1)))
    assert not res["failed"], f"requests failed while a fleet worker's instance stopped: {res}"
    _all_back(root, profile)
    # the fleet file is gone, so no join adds it: the machine's router gets it back as it was
    assert http(root, rt["internal_port"], f"/add_worker?url={url}", method="POST").status in (200, 400)
    assert url in http(root, rt["internal_port"], "/list_workers").body


# ---- the machine rebooted -----------------------------------------------------------------------

AFTER_S = 5  # load kept up after the endpoint is back


class Load:
    """WORKERS clients off the machine, each sending short completions in a loop (a tenth of a second's
    back-off after an error), to an address that may change across the reboot. Together they stay at half
    the profile's per-address rate limit: a 429 here would be the limit working, not the reboot."""

    def __init__(self, public: Public, cert_pem: str, key: str, model: str, addr: str,
                 rate_limit_rps: int) -> None:
        self.public, self.key, self.addr = public, key, addr
        self.pace_s = WORKERS / (rate_limit_rps / 2) if rate_limit_rps else 0.0
        self.ctx: ssl.SSLContext | None = None
        if public.tls:  # pinned to the machine's own certificate; its names are of the first boot
            self.ctx = ssl.create_default_context(cadata=cert_pem)
            self.ctx.check_hostname = False
        self.body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()
        self.codes: Counter[str] = Counter()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(WORKERS)]

    def request(self, path: str, body: bytes | None = None, timeout: float = 60) -> str:
        req = urllib.request.Request(self.public.url(path, self.addr), data=body,
                                     headers={"Authorization": f"Bearer {self.key}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ctx) as resp:
                resp.read()
                return str(resp.status)
        except urllib.error.HTTPError as e:
            return str(e.code)
        except (OSError, ssl.SSLError):
            return "000"  # refused, reset, timed out: the port was not there

    def _worker(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            code = self.request("/v1/completions", self.body)
            with self.lock:
                self.codes[code] += 1
            time.sleep(max(0.1 if code != "200" else 0.0, self.pace_s - (time.monotonic() - t0)))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=70)


def _address(root: Any) -> str | None:
    out = root.run("ip -4 -o addr show scope global")
    fields = out.stdout.split() if out.rc == 0 else []
    return fields[3].split("/")[0] if len(fields) > 3 else None


def _reboot(host: Any, root: Any) -> None:
    if host.backend.NAME == "podman":
        subprocess.run(["podman", "restart", host.backend.name], check=True,
                       capture_output=True, timeout=600)
    else:
        root.run("systemd-run --on-active=1 systemctl reboot")


def test_reboot_under_load(host: Any, root: Any, profile: dict[str, Any], api_key: HostKey,
                           public: Public, record_property: Any) -> None:
    _all_back(root, profile)
    addr = _address(root)
    if addr is None:
        pytest.skip("the machine has no global address for clients off it")
    key = root.file(api_key.path).content_string.strip()
    cert = root.file(public.cacert).content_string if public.tls else ""
    limit = profile["limits"]["start_timeout_s"]
    with Load(public, cert, key, profile["served_model_name"], addr,
              profile["router"]["rate_limit_rps"]) as load:
        time.sleep(5)
        t0 = time.monotonic()
        _reboot(host, root)

        def answers() -> bool:
            now = _address(root)  # the address can change across a container's restart
            if now:
                load.addr = now
            return load.request("/v1/models", timeout=2) == "200"
        back = wait_for(answers, timeout=limit, every=0.5)
        back_s = round(time.monotonic() - t0, 1)
        time.sleep(AFTER_S)
    assert back, f"the endpoint did not answer within {limit} s of the reboot"
    _all_back(root, profile, timeout=limit)
    res: dict[str, Any] = {"sent": sum(load.codes.values()), "back_s": back_s,
                           "failed": {c: n for c, n in load.codes.items() if c != "200"}}
    _balanced(root, profile, api_key, public, res)
    for k, v in res.items():
        record_property(k, v)
    print(f"fault reboot: {res}")
    assert load.codes["200"] > 0, f"no request served around the reboot: {res}"
    # while the machine is down nothing answers (000); once nginx is up and the model is not, 503
    assert set(res["failed"]) <= {"000", "503"}, f"unexpected failures: {res}"
