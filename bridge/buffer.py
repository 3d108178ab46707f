"""An inbox worker's buffer, bounded by count and by bytes (INBOX_BUFFER_SIZE and
INBOX_BUFFER_BYTES, shared among the workers), and the account of the envelopes lost
when it is full: docs/behaviour.md, "The inbox buffer"."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

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

    def __len__(self) -> int:
        return len(self._items)

    def room(self) -> tuple[int, int]:
        """How many more envelopes, and how many more bytes, it takes now."""
        return self.max_count - len(self._items), self.max_bytes - self.bytes

    def put_nowait(self, envelope: Envelope) -> bool:
        """Takes `envelope` when it fits; False (and nothing changes) when not."""
        count, free = self.room()
        if self._items and (count <= 0 or envelope.size > free):
            return False
        self._items.append(envelope)
        self.bytes += envelope.size
        self._wake()
        return True

    async def put(self, envelope: Envelope, within: float) -> bool:
        """Takes `envelope` once it fits, waiting up to `within` seconds; False if not."""
        return await self._until(lambda: self.put_nowait(envelope), within)

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
        if await self._until(lambda: bool(self._items), within):
            return self.get_nowait()
        return None

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until(self, done: Callable[[], bool], within: float) -> bool:
        """Whether `done()` came true within `within` seconds, asked at each change."""
        deadline = time.monotonic() + within
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return False
        return True


class DropBursts:
    """Envelopes lost before the database saw them, told as bursts (arm_core.episodes),
    one per reason: an ERROR line naming the first job, and a WARNING with the count
    once it ends (the database answers again, or the inbox stops)."""

    def __init__(self) -> None:
        self._bursts: dict[str, Episode] = {}

    def dropped(self, envelope: Envelope, reason: str, why: str) -> None:
        burst = self._bursts.get(reason)
        if burst is None:
            burst = self._bursts[reason] = Episode("inbox_drops", log, extra={"reason": reason})
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
