"""API key authentication (`--api-key` / HELIOS_API_KEY), as vLLM's `--api-key`.

With a key set, the OpenAI routes (/v1/*) and the tokenize routes need
`Authorization: Bearer KEY` (the Anthropic routes also accept `x-api-key: KEY`); /health,
/metrics, /version and the OpenAPI document stay open. The comparison is constant-time (`hmac.compare_digest`), so response timing does
not reveal how much of a guess matched.
"""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from helios_serve.http.errors import Unauthorized


async def require_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Litestar guard of the protected routes (a coroutine: Litestar runs a plain
    function guard in a worker thread, a thread hop per request for a header compare).

    Raises:
        Unauthorized: the key is missing or wrong (401, code `invalid_api_key`).
    """
    key: str | None = connection.app.state.api_key
    if key and not _bearer_matches(connection, key):
        raise Unauthorized("invalid or missing API key: send Authorization: Bearer KEY")


async def require_api_key_or_x_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """The guard of the Anthropic routes: `x-api-key: KEY` (what the anthropic clients
    send) or `Authorization: Bearer KEY`.

    Raises:
        Unauthorized: neither header carries the key (401).
    """
    key: str | None = connection.app.state.api_key
    if not key:
        return
    given = connection.headers.get("x-api-key")
    if given is not None and hmac.compare_digest(given.strip().encode(), key.encode()):
        return
    if not _bearer_matches(connection, key):
        raise Unauthorized("invalid or missing API key: send x-api-key: KEY "
                           "or Authorization: Bearer KEY")


def _bearer_matches(connection: ASGIConnection, key: str) -> bool:
    header = connection.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              key.encode())
