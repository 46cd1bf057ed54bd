"""The gate of an instance that checkpoints (serving.checkpoint; vLLM's --middleware): until the
root helper beside its start opens it, the API server answers every request 503 with
Retry-After, /health too, so neither the router nor a client reaches it, except the helper's own
requests, which carry the start's token (inference_machine.unit_checkpoint). A cold start's
checkpoint is so taken before any client's request, and a restored instance serves only once it
has given its reference answer again.

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
        # a restored instance's gate is this object as the checkpoint wrote it: closed, looking
        # for the flag, which the helper of each start removes before it restores
        self.open = not (self.token and self.flag)

    def _status(self, scope: Scope) -> int:
        """0 where the request passes, else the status it gets."""
        if scope["type"] != "http":
            return 0
        sent = next((v for k, v in scope.get("headers", ()) if k == HEADER), b"")
        holds = bool(self.token) and hmac.compare_digest(sent, self.token)
        if str(scope.get("path", "")).rstrip("/") in DEV_ROUTES:
            return 0 if holds else 403
        if self.open or holds:
            return 0
        if os.path.exists(self.flag):
            self.open = True
            return 0
        return 503

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = self._status(scope)
        if not status:
            await self.app(scope, receive, send)
            return
        body = BODY if status == 503 else FORBIDDEN
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                *([(b"retry-after", str(RETRY_AFTER_S).encode())]
                                  if status == 503 else []),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
