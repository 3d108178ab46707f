"""Who may do what over HTTP: three access levels, granted by a token's level (AUTH_MODE=
token) or by the caller's groups (AUTH_MODE=header with AUTH_GROUPS_HEADER).

- ``viewer``: everything that reads — the file list, a file, the status and its
  series, the console;
- ``operator``: a viewer who may also retry files, one or many;
- ``metrics``: GET /metrics only (a scraper's token).

A caller holds a set of these. An API_TOKENS entry without a level, every caller of
AUTH_MODE=none and every caller of AUTH_MODE=header without a groups header hold all
three: what every caller could do before levels existed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Level(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    METRICS = "metrics"


LEVELS = tuple(level.value for level in Level)

# What each level lets its holder do; "read" and "retry" are the API's, "metrics" /metrics.
GRANTS: dict[Level, frozenset[str]] = {
    Level.VIEWER: frozenset({"read"}),
    Level.OPERATOR: frozenset({"read", "retry"}),
    Level.METRICS: frozenset({"metrics"}),
}
# The level named in a 403 for a permission the caller lacks: the least that grants it.
NEEDED: dict[str, Level] = {"read": Level.VIEWER, "retry": Level.OPERATOR, "metrics": Level.METRICS}
EVERY_LEVEL = frozenset(Level)

# METRICS_AUTH: what GET /metrics asks of its caller.
METRICS_AUTH_MODES = ("level", "any", "none")


class ApiToken(NamedTuple):
    """One API_TOKENS entry: `actor:level=token`, or `actor=token` (level None: every
    level, as before levels existed)."""

    actor: str
    token: str
    level: Level | None = None

    @property
    def levels(self) -> frozenset[Level]:
        return EVERY_LEVEL if self.level is None else frozenset({self.level})


def may(levels: frozenset[Level], permission: str) -> bool:
    """Whether a caller holding `levels` has `permission` ("read", "retry", "metrics")."""
    return any(permission in GRANTS[level] for level in levels)


def shown_level(levels: frozenset[Level]) -> str | None:
    """The one level to show for a caller (the console's "signed in as … (level)"): the
    highest of the API's levels it holds, else metrics; None for no level."""
    for level in (Level.OPERATOR, Level.VIEWER, Level.METRICS):
        if level in levels:
            return level.value
    return None
