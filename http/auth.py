"""Who is calling: the actor recorded in the retry audit (AUTH_MODE)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from arm_core.config import Settings
from arm_core.http.errors import ApiError, Handler

ACTOR = web.RequestKey("actor", str)
# The console's shell ("/", "/console/…") holds no data; /api/v1/whoami answers
# {"actor": null} without credentials, so the console knows to show its sign-in form.
PUBLIC_PATHS = (
    "/healthcheck",
    "/livez",
    "/readyz",
    "/api/v1/openapi.json",
    "/",
    "/api/v1/whoami",
)
PUBLIC_PREFIXES = ("/console/",)


def _digest(token: str) -> bytes:
    # surrogateescape: a header that is not UTF-8 is compared (and refused), not a 500.
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def authenticate(
    request: web.Request, settings: Settings, tokens: Sequence[tuple[str, bytes]] = ()
) -> str:
    """The caller's identity, or ApiError 401. `tokens` are (actor, sha256 of token)."""
    if settings.auth_mode == "none":
        return "anonymous"
    if settings.auth_mode == "header":
        actor = request.headers.get(settings.auth_header, "").strip()
        if not actor:
            raise ApiError(401, "UNAUTHORIZED", f"missing {settings.auth_header} header")
        return actor[:200]
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "UNAUTHORIZED", "missing Authorization: Bearer <token>")
    # Constant time: the digests all have one length, so compare_digest takes as long
    # for a token that shares a prefix (or a length) with a configured one as for any
    # other; and every entry is compared, so how long it takes says nothing about
    # which entry matched or whether one did.
    given = _digest(token.strip())
    actor_found = None
    for actor, expected in tokens or [(a, _digest(t)) for a, t in settings.api_tokens]:
        if hmac.compare_digest(given, expected):
            actor_found = actor
    if actor_found is None:
        raise ApiError(401, "UNAUTHORIZED", "invalid token")
    return actor_found


def auth_middleware(settings: Settings) -> Middleware:
    """Sets request[ACTOR] for every non-public path; 401 (changing nothing) without
    valid credentials."""

    tokens = [(actor, _digest(token)) for actor, token in settings.api_tokens]

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PUBLIC_PATHS and not request.path.startswith(PUBLIC_PREFIXES):
            request[ACTOR] = authenticate(request, settings, tokens)
        return await handler(request)

    return middleware
