"""The gate of an instance that checkpoints (serving.checkpoint; vLLM's --middleware): until the
root helper beside its start opens it, the API server answers every request 503 with
Retry-After, /health too, so neither the router nor a client reaches it, except the helper's own
requests, which carry the start's token (inference_image.startup.unit_checkpoint). A cold start's
checkpoint is so taken before any client's request, and a restored instance serves only once it
has given its reference answer again.

inference-run sets INFERENCE_CHECKPOINT_TOKEN and INFERENCE_CHECKPOINT_GATE (the flag file the
helper makes to open it) from the helper's word; without both the gate is open."""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HEADER = b"x-inference-checkpoint"
RETRY_AFTER_S = 5
BODY = (b'{"error": {"message": "the instance is starting (its checkpoint is being taken or '
        b'restored)", "type": "unavailable", "code": 503}}')


class Gate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.token = os.environ.get("INFERENCE_CHECKPOINT_TOKEN", "").encode()
        self.flag = os.environ.get("INFERENCE_CHECKPOINT_GATE", "")
        # a restored instance's gate is this object as the checkpoint wrote it: closed, looking
        # for the flag, which the helper of each start removes before it restores
        self.open = not (self.token and self.flag)

    def _passes(self, scope: Scope) -> bool:
        if self.open or scope["type"] != "http":
            return True
        if os.path.exists(self.flag):
            self.open = True
            return True
        sent = next((v for k, v in scope.get("headers", ()) if k == HEADER), b"")
        return hmac.compare_digest(sent, self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._passes(scope):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"),
                                (b"retry-after", str(RETRY_AFTER_S).encode()),
                                (b"content-length", str(len(BODY)).encode())]})
        await send({"type": "http.response.body", "body": BODY})
