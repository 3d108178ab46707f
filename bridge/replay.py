"""The answers of the last few seconds, as core NATS delivered them, for the moments
RESULTS_STREAM did not store what services published: a stream captures a core NATS
publish only through its leader, so what comes while the leadership moves is stored by
no one (docs/not-losing-answers.md, "On a NATS cluster").

With RESULTS_STREAM each bridge also subscribes to the result subject with core NATS,
in its queue group, and keeps what arrives for `seconds` in memory, unparsed. When the
stream announces a new leader (the LEADER_ELECTED advisory), or this bridge's connection
comes back (the advisory may have come meanwhile), it hands what it kept to its inbox:
the database applies what the stream lost and calls the rest duplicates."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg

from arm_core.bridge import events
from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.inbox import Inbox
from arm_core.bridge.nats_client import confirm
from arm_core.bridge.service import Service, Supervisor, stopped_within

log = logging.getLogger(__name__)


@dataclass
class Recent:
    """Core NATS messages of the last `seconds`, at most `limit` of them and `max_bytes`
    of their data (a quarter of INBOX_BUFFER_BYTES): the oldest go first."""

    seconds: float
    limit: int = 100_000
    max_bytes: int = 32 << 20
    bytes: int = field(default=0, init=False)
    _kept: deque[tuple[float, Msg]] = field(default_factory=deque, init=False)

    def __len__(self) -> int:
        return len(self._kept)

    async def keep(self, msg: Msg) -> None:
        """nats-py subscription callback: remembers the message, forgets the expired."""
        now = time.monotonic()
        self._kept.append((now, msg))
        self.bytes += len(msg.data)
        self._expire(now)

    def _expire(self, now: float) -> None:
        kept = self._kept
        while kept and (
            now - kept[0][0] > self.seconds or len(kept) > self.limit or self.bytes > self.max_bytes
        ):
            self.bytes -= len(kept.popleft()[1].data)

    def take(self) -> list[Msg]:
        """What arrived in the last `seconds`, oldest first; the buffer is emptied (what
        comes after is kept for the next election)."""
        self._expire(time.monotonic())
        taken = [msg for _, msg in self._kept]
        self._kept.clear()
        self.bytes = 0
        return taken


@dataclass(eq=False)
class Replayer(Service):
    """On each leader-elected advisory of the stream, waits `delay_seconds` for the
    answers published before the election to arrive here, then hands what `recent` kept
    to the inbox."""

    recent: Recent
    inbox: Inbox
    stream: str
    delay_seconds: float = 1.0
    name = "replay"
    # The advisories not yet replayed (their leader's name), in the order they came.
    _elected: asyncio.Queue[str] = field(default_factory=asyncio.Queue, init=False)

    async def on_advisory(self, msg: Msg) -> None:
        """nats-py callback of the advisory subject: queues the election, never waits
        (nats-py runs a subscription's callbacks one at a time)."""
        try:
            leader = str(json.loads(msg.data).get("leader") or "")
        except (ValueError, AttributeError):
            leader = ""
        self._elected.put_nowait(leader)

    def reconnected(self) -> None:
        """This bridge's NATS connection came back (it moved to another server, say when
        its node entered lame-duck mode): an advisory sent meanwhile never reached it."""
        self._elected.put_nowait("")

    async def run_once(self, leader: str = "") -> int:
        """Hands what was kept to the inbox now; returns how many."""
        taken = self.recent.take()
        events.replayed(self.inbox, len(taken), self.stream, leader)
        for msg in taken:
            await self.inbox.on_message(msg, settle=False)
        return len(taken)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self.beat()
            try:
                leader = await asyncio.wait_for(self._elected.get(), 1.0)
            except TimeoutError:
                continue
            # Answers published just before the election may still be on their way here.
            if not await stopped_within(stopping, self.delay_seconds):
                await self.run_once(leader)


async def keep_recent_answers(
    nats: Client, c: BridgeConfig, inbox: Inbox, supervisor: Supervisor
) -> tuple[Recent, Replayer]:
    """RESULTS_STREAM: also receive the answers by core NATS (queue group), keep them for
    RESULTS_STREAM_REPLAY_SECONDS, and apply them again when the stream elects a leader;
    the replay's loop runs under `supervisor`. Without the permissions for it (the user's
    subscribe allow list, deploy/nats/nats-permissions.conf) the server refuses the SUBs:
    logged, and the bridge goes on without."""
    s = c.settings
    stream = s.results_stream
    # A quarter of INBOX_BUFFER_BYTES for the copies, and as much for nats-py's queue in
    # front of them.
    share = max(1, s.inbox_buffer_bytes // 4)
    recent = Recent(s.results_stream_replay_seconds, max_bytes=share)
    replayer = Replayer(recent, inbox, stream, c.replay_delay_seconds)
    replayer.start(supervisor)
    error_before = nats.last_error
    await nats.subscribe(
        s.result_subject, queue=s.nats_queue_group, cb=recent.keep, pending_bytes_limit=share
    )
    elected = f"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{stream}"
    await nats.subscribe(elected, cb=replayer.on_advisory)
    await confirm(nats)
    error = nats.last_error
    if error is not None and error is not error_before and "permissions" in str(error).lower():
        log.warning(
            "NATS refused a subscription (%s): the answers services publish with core "
            "NATS while stream %s has no leader are not kept (allow the subscriptions "
            "of deploy/nats/nats-permissions.conf)",
            error,
            stream,
            extra={"action": "stream_replay_refused"},
        )
    return recent, replayer
