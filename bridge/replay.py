"""The answers of the last few seconds, as core NATS delivered them, for the moments
RESULTS_STREAM did not store what services published.

A stream captures a core NATS publish only through its leader. When the leadership
moves — the leader's node dies (the others wait 4–9 s before electing), or a planned
restart hands it over (tens of milliseconds) — what services publish with core NATS in
between is stored by no one. Services that publish through JetStream retry until the
stream has their answer; services that publish with core NATS do not know.

So, with RESULTS_STREAM, each bridge also subscribes to the result subject with core
NATS, in its queue group (each answer reaches one bridge), and keeps what arrives for
`seconds` in memory — nothing is parsed, nothing reaches the database. When the stream
announces a new leader (the `$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.<stream>`
advisory), every bridge hands what it kept to its inbox as if it had just come: the
database applies what the stream lost and calls the rest duplicates (each answer has its
Nats-Msg-Id). Cost: each answer crosses the network twice, and a leader's election
replays `seconds` of answers into the database once."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from nats.aio.msg import Msg


@dataclass
class Recent:
    """Core NATS messages of the last `seconds`, at most `limit` (the oldest go first)."""

    seconds: float
    limit: int = 100_000
    _kept: deque[tuple[float, Msg]] = field(default_factory=deque, init=False)

    def __len__(self) -> int:
        return len(self._kept)

    async def keep(self, msg: Msg) -> None:
        """nats-py subscription callback: remembers the message, forgets the expired."""
        now = time.monotonic()
        self._kept.append((now, msg))
        self._expire(now)

    def _expire(self, now: float) -> None:
        kept = self._kept
        while kept and (now - kept[0][0] > self.seconds or len(kept) > self.limit):
            kept.popleft()

    def take(self) -> list[Msg]:
        """What arrived in the last `seconds`, oldest first; the buffer is emptied (what
        comes after is kept for the next election)."""
        self._expire(time.monotonic())
        taken = [msg for _, msg in self._kept]
        self._kept.clear()
        return taken
