"""The gate of an instance that checkpoints (serving.checkpoint; vLLM's --middleware): while the
root helper beside its start has not made its flag, the API server answers every request 503 with
Retry-After, /health too, so neither the router nor a client reaches it, except the helper's own
requests, which carry the start's token (inference_machine.unit_checkpoint). The helper opens it
as soon as a cold start answers, and shuts it again at the instance's first idle moment for the
checkpoint's take (the router holds what comes meanwhile); a restored instance serves only once it
has given its reference answer again. To the token alone, STATE_PATH says how many clients'
requests are inside the instance, which the helper reads to find an idle moment and to drain one.

inference-run sets INFERENCE_CHECKPOINT_TOKEN and INFERENCE_CHECKPOINT_GATE (the flag file the
helper makes to open it) from the helper's word; without both the gate is open. vLLM's dev routes,
which a checkpoint needs (VLLM_SERVER_DEV_MODE: /sleep, /wake_up and the rest), answer 403 to any
request without the token, open or not: a checkpoint needs them only while the gate is closed, and
/collective_rpc runs a method of the engine's workers by name."""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from . import switches

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HEADER = b"x-inference-checkpoint"
RETRY_AFTER_S = 5
# the clients' requests inside the instance, to the token alone (the helper's idle moment)
STATE_PATH = "/inference-gate"
# vLLM 0.26's dev routes (vllm/entrypoints/serve/dev/)
DEV_ROUTES = frozenset({
    "/abort_requests", "/collective_rpc", "/finish_weight_update", "/get_world_size",
    "/init_weight_transfer_engine", "/is_paused", "/is_sleeping", "/pause",
    "/reset_encoder_cache", "/reset_mm_cache", "/reset_prefix_cache", "/resume", "/server_info",
    "/sleep", "/start_draft_weight_update", "/start_weight_update", "/update_weights",
    "/wake_up"})
FORBIDDEN = b'{"error": {"message": "not served", "type": "forbidden", "code": 403}}'
BODY = (b'{"error": {"message": "the instance is starting (its checkpoint is being taken or '
        b'restored)", "type": "unavailable", "code": 503}}')


class Gate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.token = os.environ.get(switches.CHECKPOINT_TOKEN, "").encode()
        self.flag = os.environ.get(switches.CHECKPOINT_GATE, "")
        # a restored instance's gate is this object as the checkpoint wrote it: it reads the
        # flag, which the helper of each start removes before it restores, at each request
        self.gated = bool(self.token and self.flag)
        self.inflight = 0

    def _holds(self, scope: Scope) -> bool:
        sent = next((v for k, v in scope.get("headers", ()) if k == HEADER), b"")
        return bool(self.token) and hmac.compare_digest(sent, self.token)

    def _status(self, scope: Scope, holds: bool) -> int:
        """0 where the request passes, else the status it gets."""
        if scope["type"] != "http":
            return 0
        if str(scope.get("path", "")).rstrip("/") in (*DEV_ROUTES, STATE_PATH):
            return 0 if holds else 403
        if not self.gated or holds or os.path.exists(self.flag):
            return 0
        return 503

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        holds = scope["type"] == "http" and self._holds(scope)
        status = self._status(scope, holds)
        if not status and str(scope.get("path", "")).rstrip("/") == STATE_PATH:
            await _answer(send, 200, b'{"inflight": %d}' % self.inflight)
            return
        if not status:
            # a client's request is counted from the gate until its answer's last byte
            counted = scope["type"] == "http" and not holds
            self.inflight += counted
            try:
                await self.app(scope, receive, send)
            finally:
                self.inflight -= counted
            return
        await _answer(send, status, BODY if status == 503 else FORBIDDEN)


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            *([(b"retry-after", str(RETRY_AFTER_S).encode())]
                              if status == 503 else []),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
