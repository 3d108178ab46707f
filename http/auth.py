"""Who is calling: the actor recorded in the retry audit (AUTH_MODE)."""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Middleware

from arm_core.config import Settings
from arm_core.http.errors import ApiError, Handler

ACTOR = web.RequestKey("actor", str)
PUBLIC_PATHS = ("/healthcheck", "/api/v1/openapi.json")


def authenticate(request: web.Request, settings: Settings) -> str:
    """The caller's identity, or ApiError 401."""
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
    given = token.strip().encode()
    actor_found = None
    for actor, expected in settings.api_tokens:  # compare every entry: constant time
        if hmac.compare_digest(given, expected.encode()):
            actor_found = actor
    if actor_found is None:
        raise ApiError(401, "UNAUTHORIZED", "invalid token")
    return actor_found


def auth_middleware(settings: Settings) -> Middleware:
    """Sets request[ACTOR] for every non-public path; 401 (changing nothing) without
    valid credentials."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PUBLIC_PATHS:
            request[ACTOR] = authenticate(request, settings)
        return await handler(request)

    return middleware
