"""One way to ask an HTTP(S) server something: the whole exchange (connect, headers, body) within
a deadline and the body within a size cap, or one OSError saying which. urllib's timeout bounds
each socket read, so a server that sends its headers a byte a second holds its caller forever; here
a watchdog shuts the connection down at the deadline, wherever the exchange is."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field

MAX_BYTES = 16 * 2**20


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def fetch(url: str, *, deadline_s: float, max_bytes: int = MAX_BYTES, method: str = "GET",
          body: bytes | None = None, headers: dict[str, str] | None = None,
          context: ssl.SSLContext | None = None, idle_s: float = 10.0) -> Answer:
    """The answer at `url`, whole within `deadline_s` and at most `max_bytes` of body. OSError
    (TimeoutError for the deadline) names the URL and what went wrong; an HTTP error status is an
    Answer, for the caller to judge. `idle_s`: the longest silence between two reads (a server
    that answers only once its work is done, as vLLM's /collective_rpc does, needs its length)."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise OSError(f"{url!r}: not an http:// or https:// URL with a host")
    try:
        port = u.port
    except ValueError:
        raise OSError(f"{url!r}: not a port number") from None
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    if any(ord(ch) < 33 or ord(ch) == 127 for ch in path):
        raise OSError(f"{url!r}: a space or control character in the path")
    per_read = min(deadline_s, idle_s)
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection(u.hostname, port, timeout=per_read, context=context)
        if u.scheme == "https" else http.client.HTTPConnection(u.hostname, port, timeout=per_read))
    expired = threading.Event()
    held: list[socket.socket] = []  # the connection's socket (http.client lets go of it early)

    def shut() -> None:
        expired.set()
        for sock in [*held, *([conn.sock] if conn.sock is not None else [])]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(deadline_s, shut)
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.connect()
        held.append(conn.sock)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        buf = bytearray()
        while chunk := resp.read1(65536):
            buf += chunk
            if len(buf) > max_bytes:
                raise OSError(f"{url}: an answer of more than {max_bytes // 2**20} MiB")
        if expired.is_set():
            raise OSError("cut at the deadline")
        return Answer(resp.status, bytes(buf), {k.lower(): v for k, v in resp.getheaders()})
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise TimeoutError(f"{url}: no whole answer within {deadline_s:g} s") from None
        if isinstance(exc, OSError) and str(exc).startswith(url):
            raise
        raise OSError(f"{url}: {exc or type(exc).__name__}") from None
    finally:
        watchdog.cancel()
        conn.close()
