"""The access settings of :class:`arm_core.config.Settings`: who a caller is and which
levels it holds (AUTH_MODE, API_TOKENS, AUTH_HEADER, AUTH_GROUPS_HEADER and the group
lists, arm_core.access), parsed one variable at a time and then checked together, and
whether `serve` may listen where other machines reach it without credentials.

A bad API_TOKENS entry is named by its position: no part of a token is ever quoted.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from arm_core.access import LEVELS, ApiToken, Level
from arm_core.config_error import ConfigError

if TYPE_CHECKING:
    from arm_core.config import Settings

AUTH_MODES = ("none", "token", "header")


def parse_tokens(name: str, raw: str) -> tuple[ApiToken, ...]:
    """`actor:level=token,actor2=token2` → (ApiToken, …): `:level` (viewer, operator or
    metrics) is optional; an entry without one has every level, as before levels
    existed. A bad entry is named by its position: any part of it may be a token."""
    entries = [part.strip() for part in raw.split(",") if part.strip()]
    parsed: list[ApiToken] = []
    for n, entry in enumerate(entries, 1):
        who, sep, token = entry.partition("=")
        who, token = who.strip(), token.strip()
        where = f"{name}: entry {n} of {len(entries)}"
        if not sep:
            raise ConfigError(f"{where}: expected actor:level=token (no = in it)")
        actor, colon, level = who.rpartition(":") if ":" in who else (who, "", "")
        actor, level = actor.strip(), level.strip()
        if not actor:
            raise ConfigError(f"{where}: expected actor:level=token (the actor is empty)")
        if colon and level not in LEVELS:
            # Not quoted: whatever stands there may be part of a token put in the wrong place.
            raise ConfigError(
                f"{where}: the access level after ':' is not one of {', '.join(LEVELS)}"
            )
        if len(token) < 16:
            raise ConfigError(f"{where}: the token is shorter than 16 characters")
        for m, earlier in enumerate(parsed, 1):
            if earlier.token == token:
                levels = {earlier.level or "every level", level or "every level"}
                raise ConfigError(
                    f"{where}: the same token as entry {m}"
                    + (
                        f", with another level ({' and '.join(sorted(levels))})"
                        if len(levels) > 1
                        else ""
                    )
                    + "; the audit could not tell who"
                )
        parsed.append(ApiToken(actor, token, Level(level) if colon else None))
    return tuple(parsed)


def parse_groups(name: str, raw: str) -> frozenset[str]:
    """`group,group2` → the set of group names (as the groups header lists them)."""
    groups = frozenset(part.strip() for part in raw.split(",") if part.strip())
    if raw.strip() and not groups:
        raise ConfigError(f"{name}: expected comma-separated group names")
    return groups


def parse_header(name: str, raw: str) -> str:
    value = raw.strip()
    if not value or not all(c.isalnum() or c == "-" for c in value):
        raise ConfigError(f"{name}: not an HTTP header name: {raw!r}")
    return value


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable from this machine only: localhost,
    127.0.0.0/8, ::1. An empty host (every interface) or any other name is not."""
    value = host.strip().strip("[]").lower()
    if value == "localhost":
        return True
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


def check_access(settings: Settings) -> None:
    """API_TOKENS with AUTH_MODE=token; group settings only with AUTH_MODE=header and its
    groups header, and a groups header only with a group that lets someone in;
    ConfigError naming the variable."""
    if settings.auth_mode == "token" and not settings.api_tokens:
        raise ConfigError("API_TOKENS: required when AUTH_MODE=token")
    lists = {
        "AUTH_OPERATOR_GROUPS": settings.auth_operator_groups,
        "AUTH_VIEWER_GROUPS": settings.auth_viewer_groups,
        "AUTH_METRICS_GROUPS": settings.auth_metrics_groups,
    }
    given = [name for name, groups in lists.items() if groups]
    header = settings.auth_groups_header
    if header and settings.auth_mode != "header":
        raise ConfigError(
            f"AUTH_GROUPS_HEADER: only for AUTH_MODE=header (AUTH_MODE={settings.auth_mode})"
        )
    if given and not header:
        raise ConfigError(
            f"{given[0]}: needs AUTH_GROUPS_HEADER, the header in which the "
            "authenticating proxy lists the caller's groups (e.g. X-Forwarded-Groups), "
            "and AUTH_MODE=header"
        )
    if header and not given:
        raise ConfigError(
            "AUTH_GROUPS_HEADER: set, but AUTH_OPERATOR_GROUPS, AUTH_VIEWER_GROUPS and "
            "AUTH_METRICS_GROUPS are all empty: every caller would be refused"
        )
    if header and header.lower() == settings.auth_header.lower():
        raise ConfigError(
            f"AUTH_GROUPS_HEADER: the same header as AUTH_HEADER ({settings.auth_header})"
        )


def require_safe_exposure(settings: Settings) -> None:
    """`arm-core serve` with AUTH_MODE=none on an address other machines can reach
    would let anyone retry files, audited as "anonymous": refused unless
    AUTH_ALLOW_ANONYMOUS=true says that is intended."""
    if (
        settings.auth_mode != "none"
        or settings.auth_allow_anonymous
        or is_loopback(settings.http_host)
    ):
        return
    raise ConfigError(
        f"HTTP_HOST: {settings.http_host!r} is not a loopback address and AUTH_MODE=none, "
        'so anyone who can reach it could retry files, audited as "anonymous". Set '
        "AUTH_MODE=token (with API_TOKENS) or AUTH_MODE=header (behind an "
        "authenticating proxy), listen on HTTP_HOST=127.0.0.1, or set "
        "AUTH_ALLOW_ANONYMOUS=true if anonymous access from the network is intended"
    )
