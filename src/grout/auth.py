"""API keys for ``grout serve``: requests to ``/v1`` carry ``Authorization: Bearer <key>``.

As OpenAI and vLLM check them: a request without one of the server's keys gets HTTP 401 with
an OpenAI-shaped body (code ``invalid_api_key``), which the ``openai`` client raises as
``AuthenticationError``. ``/health`` stays open (load balancers probe it without a key), and
so do CORS preflights (browsers send them without credentials; the CORS layer, outside this
one, answers them).
"""
from __future__ import annotations

import hmac
import json
from typing import Any

from grout.protocol import APIError

KEY_ENV = "GROUT_API_KEY"


class RequireAPIKey:
    """ASGI middleware refusing ``/v1`` requests that carry none of ``keys``."""

    def __init__(self, app: Any, keys: tuple[str, ...]) -> None:
        self.app = app
        self.keys = tuple(k.encode() for k in keys)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1") or \
                scope["method"] == "OPTIONS" or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        err = APIError("a valid API key is needed: send it as the header 'Authorization: "
                       "Bearer <key>' (the openai client's api_key)", status=401,
                       code="invalid_api_key")
        body = json.dumps(err.body()).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Any) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                token = token.strip()
                # compare_digest with every key: the time taken tells nothing of a key
                return scheme.lower() == b"bearer" and \
                    sum(hmac.compare_digest(token, k) for k in self.keys) > 0
        return False
