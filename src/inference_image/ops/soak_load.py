"""`python load.py CONFIG` (inference-image soak copies this file to the machine for the soak's
length and runs it with the machine's runtime, so no image carries it): load at
the tier's concurrency through the public port, one JSON line a minute (requests that answered
and failed, latency percentiles, each service's resident memory), with the machine's bounded
HTTP client (a request that hangs is cut at its deadline). CONFIG: JSON with profile_json, out,
minutes, concurrency, max_tokens (and interval_s)."""
# ruff: noqa: ANN001, ANN202, SIM115
import json
import os
import ssl
import sys
import threading
import time

from inference_machine.bounded_http import fetch


def main(argv: list[str]) -> None:
    cfg = json.loads(argv[0])
    prof = json.load(open(cfg["profile_json"]))
    ep = json.load(open(prof["paths"]["endpoint"]))
    key = open(prof["paths"]["api_key"]).read().strip()
    tls = ep["tls"] != "off"
    ctx = ssl.create_default_context(cafile=ep["tls_cert"]) if tls else None
    url = f"{'https' if tls else 'http'}://127.0.0.1:{prof['router']['port']}/v1/completions"
    unit = prof["contract"]["unit"]
    units = ([unit["public"], unit["router"]]
             + [unit["instance"].replace("@.", f"@{i['name']}.") for i in prof["instances"]])
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
             "juliet", "kilo", "lima"]
    lock = threading.Lock()
    window: list[tuple[float, str]] = []  # (latency_s, code) of the current minute
    stop = threading.Event()
    out = open(cfg["out"], "a", buffering=1)

    def rss_mib(unit):
        # the unit's processes by their cgroup (v1 or v2 alike; a template unit sits in its own
        # slice, system-vllm.slice), their resident sets summed
        total, mark = 0, f"/{unit}"
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if mark not in open(f"/proc/{pid}/cgroup").read():
                    continue
                for line in open(f"/proc/{pid}/status"):
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                pass
        return round(total / 1024, 1)

    def worker(n):
        i = 0
        while not stop.is_set():
            i += 1
            body = json.dumps({"model": prof["served_model_name"], "max_tokens": cfg["max_tokens"],
                               "ignore_eos": True, "temperature": 0.7,
                               "prompt": f"{words[(n + i) % len(words)]} {i} tells a story about"}).encode()
            t0 = time.monotonic()
            try:
                code = str(fetch(url, deadline_s=600, method="POST", body=body, context=ctx, headers={
                    "Authorization": f"Bearer {key}", "Content-Type": "application/json"}).status)
            except OSError:
                code = "000"
            with lock:
                window.append((time.monotonic() - t0, code))
            if code != "200":
                time.sleep(0.1)

    def pct(xs, q):
        return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1) if xs else None

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(cfg["concurrency"])]
    for t in threads:
        t.start()
    start = time.monotonic()
    for minute in range(1, cfg["minutes"] + 1):
        time.sleep(max(0, start + cfg.get("interval_s", 60) * minute - time.monotonic()))
        with lock:
            rows, window[:] = list(window), []
        lat = sorted(s for s, c in rows if c == "200")
        codes = {}
        for _, c in rows:
            codes[c] = codes.get(c, 0) + 1
        out.write(json.dumps({"minute": minute, "ok": codes.pop("200", 0), "failed": codes,
                              "p50_ms": pct(lat, 0.5), "p90_ms": pct(lat, 0.9), "p99_ms": pct(lat, 0.99),
                              "rss_mib": {u: rss_mib(u) for u in units}}) + "\n")
    stop.set()
    for t in threads:
        t.join(timeout=600)
    out.write(json.dumps({"done": True}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
