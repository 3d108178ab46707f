"""Something that goes wrong for a while, told as one event instead of a line per
occurrence: a database outage (arm_core.db), an exhausted connection pool, a burst of
dropped answers (bridge/buffer.py).

An :class:`Episode` logs its first occurrence (`state=started`), at most one line every
`report_every` seconds while occurrences keep coming (`state=ongoing`, with `count`), and
one line when it ends (`state=ended`, with `count` and `seconds`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Episode:
    action: str
    log: logging.Logger
    # The level of the started and ongoing lines, and of the ended one.
    level: int = logging.ERROR
    end_level: int = logging.WARNING
    report_every: float = 30.0
    clock: Callable[[], float] = time.monotonic
    # Fields every line of it carries besides action and state.
    extra: dict[str, Any] = field(default_factory=dict)
    since: float | None = None
    count: int = 0
    _reported_at: float = 0.0

    def happened(self, started: str, ongoing: str, *args: Any, **extra: Any) -> None:
        """One more occurrence. The first logs `started` % args; a later one logs
        `ongoing` % (seconds so far, count so far, *args) when report_every has passed
        since the last line."""
        now = self.clock()
        if self.since is None:
            self.since, self.count, self._reported_at = now, 1, now
            self._log(self.level, started, *args, **extra, state="started")
            return
        self.count += 1
        if now - self._reported_at >= self.report_every:
            self._reported_at = now
            seconds = now - self.since
            extra |= {"state": "ongoing", "count": self.count}
            self._log(self.level, ongoing, seconds, self.count, *args, **extra)

    def end(self, message: str) -> None:
        """The episode, if any, is over: logs `message` % (seconds, count)."""
        if self.since is None:
            return
        lasted = self.clock() - self.since
        ended = {"state": "ended", "count": self.count, "seconds": round(lasted, 1)}
        self._log(self.end_level, message, lasted, self.count, **ended)
        self.since, self.count = None, 0

    def _log(self, level: int, message: str, *args: Any, **fields: Any) -> None:
        self.log.log(level, message, *args, extra={"action": self.action, **self.extra, **fields})

    def __bool__(self) -> bool:
        """Whether it is under way."""
        return self.since is not None
