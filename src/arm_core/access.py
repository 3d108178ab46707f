"""Who may do what over HTTP: the access levels a caller holds a set of
(docs/security.md#access-levels).
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
    order = (Level.OPERATOR, Level.VIEWER, Level.METRICS)
    return next((level.value for level in order if level in levels), None)
