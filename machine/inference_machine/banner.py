"""The login banner (pam_motd runs /etc/update-motd.d): how to reach this machine's API, read from
its endpoint.json, and what its first instance is doing now."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .anatomy import status
from .bounded_http import fetch
from .inputs import InputError, parse_json, printable, read_text

ENDPOINT_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Machine:
    """What the render knows and endpoint.json does not say."""

    tier: str
    instance: str
    router_port: int
    tls_mode_file: str
    acme_conf: str


def clean(value: object) -> str:
    """endpoint.json is written by first boot from values a user can set (a domain, a model
    name): nothing of it may add a line, move the cursor or recolour the terminal of whoever
    logs in."""
    return printable(value, 300)


def serving(port: int, deadline_s: float = 2.0) -> bool:
    """Whether the router answers /health (it does once an instance serves)."""
    if not 0 < port < 65536:  # no port known (a profile.json edited by hand)
        return False
    try:
        return fetch(f"http://127.0.0.1:{port}/health", deadline_s=deadline_s).status == 200
    except OSError:
        return False


def state(doc: dict[str, Any], m: Machine, is_serving: bool) -> str:
    """`serving` with the time its start took (inference-startup ready recorded it), or what
    the start is doing now."""
    if is_serving:
        ready = doc.get("ready")
        took = ready.get(m.instance, {}) if isinstance(ready, dict) else {}
        s = took.get("s") if isinstance(took, dict) else None
        return "serving" + (f" (ready {s} s after its start)"
                            if isinstance(s, int | float) and not isinstance(s, bool) else "")
    try:
        doing = status(m.instance)
    except (OSError, subprocess.SubprocessError):
        doing = ""
    return f"starting{': ' + doing if doing else ''} (journalctl -fu vllm@{m.instance})"


def banner(doc: dict[str, Any], m: Machine, now: str) -> str:
    """The banner's text for endpoint.json's `doc`, the instance's state being `now`."""
    url = clean(doc.get("url", ""))
    lines = [f"inference-image {m.tier}: OpenAI-compatible API at {url}/v1",
             f"  model:    {clean(doc.get('model', ''))}, {clean(now)}",
             f"  API key:  sudo cat {clean(doc.get('api_key', ''))}"]
    tls = doc.get("tls")
    if tls == "off":
        lines.append(f"  TLS:      off (plain HTTP; chosen by the profile or {m.tls_mode_file})")
    elif tls == "acme":
        lines += [f"  TLS:      a certificate from the ACME CA for the domain in {m.acme_conf}",
                  f'  e.g.      curl -H "Authorization: Bearer $KEY" {url}/v1/models']
    else:
        lines += [f"  TLS:      this machine's own certificate {clean(doc.get('tls_cert', ''))}",
                  f"            SHA-256 {clean(doc.get('tls_sha256', ''))}",
                  f'  e.g.      curl --cacert cert.pem -H "Authorization: Bearer $KEY" '
                  f"{url}/v1/models"]
    # what user-data wrote that first boot did not take (a key that is no bearer token, a TLS
    # mode that is no mode), one line each, as the journal has them
    refused = doc.get("refused")
    for why in (refused if isinstance(refused, list) else [])[:8]:
        lines.append(f"  REFUSED:  {clean(why)}")
    return "\n" + "\n".join(lines) + "\n\n"


def motd(endpoint: Path, m: Machine) -> str:
    """The banner, or nothing when endpoint.json is missing or not a JSON object (first boot has
    not written it yet): a login is never held up or greeted by a traceback."""
    try:
        doc = parse_json(read_text(endpoint, "endpoint.json", ENDPOINT_MAX_BYTES))
    except (InputError, ValueError):
        return ""
    if not isinstance(doc, dict):
        return ""
    return banner(doc, m, state(doc, m, serving(m.router_port)))
