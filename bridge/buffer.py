"""An inbox worker's buffer, bounded by count and by bytes (INBOX_BUFFER_SIZE and
INBOX_BUFFER_BYTES, shared among the workers), and the account of the envelopes lost
when it is full: one line when a burst of drops starts, one when it ends.

An envelope costs the buffer its message's size as it came (Envelope.size). The buffer
takes an envelope while both bounds hold; one that would break either waits or is
dropped (bridge/inbox.py decides which)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from arm_core.bridge.envelope import Envelope
from arm_core.episodes import Episode

log = logging.getLogger(__name__)


class Buffer:
    """A FIFO of envelopes holding at most `max_count` of them and `max_bytes` of their
    sizes (an envelope larger than `max_bytes` alone is taken into an empty buffer, so
    nothing is refused for ever)."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self.bytes = 0
        self._items: deque[Envelope] = deque()
        self._changed = asyncio.Event()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def fits(self, envelope: Envelope) -> bool:
        if not self._items:
            return True
        return len(self._items) < self.max_count and self.bytes + envelope.size <= self.max_bytes

    def room(self) -> tuple[int, int]:
        """How many more envelopes, and how many more bytes, it takes now."""
        return self.max_count - len(self._items), self.max_bytes - self.bytes

    def put_nowait(self, envelope: Envelope) -> bool:
        """Takes `envelope` when it fits; False (and nothing changes) when not."""
        if not self.fits(envelope):
            return False
        self._items.append(envelope)
        self.bytes += envelope.size
        self._wake()
        return True

    async def put(self, envelope: Envelope, within: float) -> bool:
        """Takes `envelope` once it fits, waiting up to `within` seconds; False if not."""
        deadline = time.monotonic() + within
        while not self.put_nowait(envelope):
            left = deadline - time.monotonic()
            if left <= 0 or not await self._wait(left):
                return False
        return True

    def take(self, which: Callable[[Envelope], bool]) -> list[Envelope]:
        """Takes out every envelope `which` says, in order; the others stay, in order."""
        taken = [e for e in self._items if which(e)]
        if taken:
            self._items = deque(e for e in self._items if not which(e))
            self.bytes = sum(e.size for e in self._items)
            self._wake()
        return taken

    def get_nowait(self) -> Envelope:
        envelope = self._items.popleft()
        self.bytes -= envelope.size
        self._wake()
        return envelope

    async def get(self, within: float) -> Envelope | None:
        """The oldest envelope, waiting up to `within` seconds for one; None if none."""
        deadline = time.monotonic() + within
        while not self._items:
            left = deadline - time.monotonic()
            if left <= 0 or not await self._wait(left):
                return None
        return self.get_nowait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self, within: float) -> bool:
        try:
            await asyncio.wait_for(self._changed.wait(), within)
            return True
        except TimeoutError:
            return False


class Snoozed:
    """Envelopes of one worker that wait to be applied again at a later time (their job
    is still queued: see Inbox), the oldest first."""

    def __init__(self) -> None:
        self._items: deque[tuple[float, Envelope]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, envelope: Envelope, at: float) -> None:
        self._items.append((at, envelope))

    def ready(self, now: float) -> bool:
        """Whether the oldest one's time has come."""
        return bool(self._items) and self._items[0][0] <= now

    def due(self, now: float) -> list[Envelope]:
        """Takes out those whose time has come, in order."""
        taken: list[Envelope] = []
        while self._items and self._items[0][0] <= now:
            taken.append(self._items.popleft()[1])
        return taken

    def take_all(self) -> list[Envelope]:
        taken = [e for _, e in self._items]
        self._items.clear()
        return taken


@dataclass
class DropBursts:
    """Envelopes lost before the database saw them, told as bursts (arm_core.episodes):
    an ERROR line when a burst of drops for a reason starts (naming the first job), one
    every `report_every` seconds while it lasts, and a WARNING with the count when it
    ends (the database answers again, or the inbox stops). Each envelope is also a
    DEBUG line with its job id."""

    report_every: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _bursts: dict[str, Episode] = field(default_factory=dict)

    def dropped(self, envelope: Envelope, reason: str, why: str) -> None:
        burst = self._bursts.get(reason)
        if burst is None:
            burst = self._bursts[reason] = Episode(
                "inbox_drops",
                log,
                report_every=self.report_every,
                clock=self.clock,
                extra={"reason": reason},
            )
        burst.happened(
            "dropping answers: %s; their jobs time out at their reply deadline unless "
            "the answer comes again (first: job %s)",
            "still dropping answers after %.0f s: %d so far (%s; the latest: job %s)",
            why,
            envelope.job_id,
        )

    def ended(self) -> None:
        """Every burst under way is over."""
        for burst in self._bursts.values():
            burst.end("dropped answers for %.1f s: %d of them")
        self._bursts.clear()

    def __bool__(self) -> bool:
        return any(self._bursts.values())
