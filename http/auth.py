"""Who is calling and what they may do: the actor recorded in the retry audit
(AUTH_MODE) and the access levels of arm_core.access (a token's level, or the groups an
authenticating proxy names). 401 without valid credentials, 403 with valid ones of a
level that does not grant the request; either way the request changes nothing."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from arm_core.access import EVERY_LEVEL, NEEDED, ApiToken, Level, may
from arm_core.config import Settings
from arm_core.http.errors import ApiError, Handler


@dataclass(frozen=True)
class Caller:
    """Who the credentials say, and the levels they hold."""

    actor: str
    levels: frozenset[Level]

    @property
    def audit_level(self) -> str:
        """What the retry audit records beside the actor of a retry: `operator`, or `all`
        for a credential that holds every level."""
        return "all" if self.levels == EVERY_LEVEL else Level.OPERATOR.value


log = logging.getLogger(__name__)

CALLER = web.RequestKey("caller", Caller)
# The console's shell ("/", "/console/…") holds no data; /api/v1/whoami answers
# {"actor": null} without credentials, so the console knows to show its sign-in form.
PUBLIC_PATHS = ("/healthcheck", "/livez", "/readyz", "/api/v1/openapi.json", "/", "/api/v1/whoami")

_WHAT = {"read": "reading", "retry": "retrying files", "metrics": "GET /metrics"}


def _digest(token: str) -> bytes:
    # surrogateescape: a header that is not UTF-8 is compared (and refused), not a 500.
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def token_digests(tokens: Sequence[ApiToken]) -> tuple[tuple[ApiToken, bytes], ...]:
    """API_TOKENS' entries, each with the sha256 of its token: worked out once per
    application (TOKEN_DIGESTS), compared on every request."""
    return tuple((t, _digest(t.token)) for t in tokens)


TOKEN_DIGESTS: web.AppKey[tuple[tuple[ApiToken, bytes], ...]] = web.AppKey("token_digests")


def authenticate(request: web.Request, settings: Settings) -> Caller:
    """The caller, or ApiError 401 (the tokens' digests are the application's)."""
    if settings.auth_mode == "none":
        return Caller("anonymous", EVERY_LEVEL)
    if settings.auth_mode == "header":
        actor = request.headers.get(settings.auth_header, "").strip()
        if not actor:
            raise ApiError(401, "UNAUTHORIZED", f"missing {settings.auth_header} header")
        return Caller(actor[:200], _group_levels(request, settings))
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "UNAUTHORIZED", "missing Authorization: Bearer <token>")
    # Constant time: the digests all have one length, so compare_digest takes as long
    # for a token that shares a prefix (or a length) with a configured one as for any
    # other; and every entry is compared, so how long it takes says nothing about
    # which entry matched or whether one did.
    given = _digest(token.strip())
    found = None
    for entry, expected in request.app[TOKEN_DIGESTS]:
        if hmac.compare_digest(given, expected):
            found = entry
    if found is None:
        raise ApiError(401, "UNAUTHORIZED", "invalid token")
    return Caller(found.actor, found.levels)


def _group_levels(request: web.Request, settings: Settings) -> frozenset[Level]:
    """AUTH_MODE=header: without AUTH_GROUPS_HEADER every level; with it, the levels the
    caller's groups (that header's lines, each comma-separated) are given."""
    if not settings.auth_groups_header:
        return EVERY_LEVEL
    # A proxy may send one line per group (oauth2-proxy does) or one comma-separated line.
    lines = request.headers.getall(settings.auth_groups_header, [])
    groups = {g.strip() for line in lines for g in line.split(",") if g.strip()}
    granted = {
        Level.OPERATOR: settings.auth_operator_groups,
        Level.VIEWER: settings.auth_viewer_groups,
        Level.METRICS: settings.auth_metrics_groups,
    }
    return frozenset(level for level, names in granted.items() if groups & names)


def require(caller: Caller, permission: str) -> None:
    """ApiError 403 FORBIDDEN, naming the level needed, unless `caller` may."""
    if may(caller.levels, permission):
        return
    needed = NEEDED[permission].value
    held = sorted(level.value for level in caller.levels)
    raise ApiError(
        403,
        "FORBIDDEN",
        f"{_WHAT[permission]} needs the {needed} level; {caller.actor} holds "
        + (", ".join(held) if held else "no level (in none of the configured groups)"),
        {"needed": needed, "levels": held},
    )


def warn_unlevelled_tokens(settings: Settings) -> None:
    """Logs once, at start, the API_TOKENS entries that name no level: each still holds
    every level, as before levels existed, until 2.0 refuses it (CHANGELOG)."""
    unlevelled = settings.unlevelled_tokens()
    if not unlevelled:
        return
    log.warning(
        "API_TOKENS: %d of %d entries name no access level (actors: %s); each holds every "
        "level (viewer, operator, metrics) until 2.0, which refuses it. Name one per entry: "
        "actor:viewer=…, actor:operator=… or actor:metrics=… (docs/security.md)",
        len(unlevelled),
        len(settings.api_tokens),
        ", ".join(t.actor for t in unlevelled),
        extra={"action": "deprecated"},
    )


def auth_middleware(
    settings: Settings, permissions: Mapping[Callable[..., object], str]
) -> Middleware:
    """Sets request[CALLER] for every non-public path whose caller may: what it needs is
    `permissions[handler]`, else "read"; GET /metrics asks what METRICS_AUTH says."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in PUBLIC_PATHS or path.startswith("/console/"):
            return await handler(request)
        if path == "/metrics":
            if settings.metrics_auth != "none":
                caller = authenticate(request, settings)
                if settings.metrics_auth == "level":
                    require(caller, "metrics")
                elif not caller.levels:
                    require(caller, "read")  # in no group: no access at all
            return await handler(request)
        caller = authenticate(request, settings)
        require(caller, permissions.get(request.match_info.handler, "read"))
        request[CALLER] = caller
        return await handler(request)

    return middleware
