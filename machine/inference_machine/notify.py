"""Beside a Type=notify vLLM instance (inference-run starts it, detached, in the unit's cgroup):
tell systemd the instance is started once its /health answers, then, for an instance over several
machines, watch that its other stages are still there and stop it when they are not (systemd
starts it again, to meet them anew).

- A head watches its own requests: some in flight and no token for `stall_s` means a stage on
  another machine is gone (vLLM would wait on it for good); an idle head sends itself a
  one-token probe every `probe_every_s`, which stays in flight when the stages are gone.
- A node holds a connection to the head's rendezvous port: it ends when the head does."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
from dataclasses import dataclass

from .bounded_http import fetch
from .contract import ENV
from .inputs import Refused, finite


@dataclass
class Limits:
    stall_s: float = 60.0
    probe_every_s: float = 30.0
    poll_s: float = 5.0
    stop_timeout_s: float = 15.0


def _get(port: str, path: str, timeout: float = 5.0) -> tuple[int, str]:
    got = fetch(f"http://127.0.0.1:{port}{path}", deadline_s=timeout)
    return got.status, got.body.decode(errors="replace")


def notify_ready(port: str, addr: str) -> None:
    """Wait until the instance's /health answers 200, then READY=1 to systemd's socket."""
    while port:
        try:
            if _get(port, "/health")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(1)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(f"READY=1\nSTATUS=serving on port {port}".encode(),
             "\0" + addr[1:] if addr.startswith("@") else addr)
    # systemd attributes the message by the sender's cgroup, which an exited process has not
    time.sleep(5)


def stop(pid: int, why: str, limits: Limits) -> None:
    """Stop the instance (SIGTERM; SIGKILL after the unit's stop timeout), saying why."""
    unit = os.environ.get(ENV.unit)
    print(f"inference-run: {unit}: {why}; stopping it (systemd starts it again)", flush=True)
    os.kill(pid, signal.SIGTERM)
    # vLLM whose other stage is gone can take a minute to exit on SIGTERM (its workers wait on the
    # lost peer): as long as systemd would wait for a stop, then SIGKILL
    for _ in range(int(limits.stop_timeout_s * 4)):
        time.sleep(0.25)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
    print(f"inference-run: {unit}: not stopped after {limits.stop_timeout_s:g} s; killing it",
          flush=True)
    os.kill(pid, signal.SIGKILL)


def _total(text: str, pattern: str) -> float:
    """The sum of the samples of the series `pattern` names: a sample that is no finite number
    of 0 or more (an exporter's NaN, a garbled line) is skipped, as a missing one is."""
    total = 0.0
    for v in re.findall(r"^" + pattern + r"(?:\{[^}]*\})? (\S+)$", text, re.M):
        with contextlib.suppress(Refused):
            total += finite(v, "sample", 0.0, 1e15)
    return total


def watch_head(port: str, pid: int, model: str, limits: Limits) -> None:
    def probe() -> None:  # one token; if the stages are gone it stays in flight, the sign
        body = json.dumps({"model": model, "prompt": "ping", "max_tokens": 1}).encode()
        with contextlib.suppress(OSError):
            fetch(f"http://127.0.0.1:{port}/v1/completions", method="POST", body=body,
                  headers={"Content-Type": "application/json"}, deadline_s=limits.stall_s * 3)

    moved, probed, last = time.monotonic(), 0.0, None
    while True:
        time.sleep(limits.poll_s)
        try:
            text = _get(port, "/metrics")[1]
        except OSError:
            continue  # not answering at all: the unit dies or the router marks it down
        busy = _total(text, "vllm:num_requests_(?:running|waiting)")
        tokens = _total(text, "vllm:(?:prompt|generation)_tokens_total")
        now = time.monotonic()
        if tokens != last or not busy:
            moved, last = now, tokens
        if busy and now - moved > limits.stall_s:
            stop(pid, f"{busy:.0f} request(s) in flight and no token for {limits.stall_s:g} s: "
                 "a stage on another machine is gone", limits)
            return
        if not busy and now - probed > limits.probe_every_s:
            probed = now
            threading.Thread(target=probe, daemon=True).start()


def watch_node(host: str, port: int, pid: int, limits: Limits) -> None:
    # The head hosts the stages' rendezvous (torch.distributed's store) for as long as it runs: a
    # connection to it ends when the head does, and this stage then starts again, to meet the next
    # head, instead of waiting on one that is gone.
    while True:
        try:
            c = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            time.sleep(limits.poll_s)
    c.settimeout(None)
    try:
        while c.recv(1024):
            pass
    except OSError:
        pass
    stop(pid, f"the head {host} is gone (its rendezvous port {port} closed)", limits)


def run(port: str, watch: str, pid: int, model: str, limits: Limits) -> None:
    """READY=1 once the instance answers; then the head's or a node's watch (`watch`: "", "head"
    or "node:HOST:PORT")."""
    notify_ready(port, os.environ["NOTIFY_SOCKET"])
    if watch == "head":
        watch_head(port, pid, model, limits)
    elif watch.startswith("node:"):
        _, host, hport = watch.split(":")
        watch_node(host, int(hport), pid, limits)
