"""RESULTS_STREAM: the loop that fetches answers from the durable consumer every bridge
shares and hands them to the inbox, which acks each once its outcome is final
(bridge/inbox.py). What it never settles comes again after the consumer's ack wait."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from arm_core.bridge import events
from arm_core.bridge.inbox import Inbox
from arm_core.bridge.service import Service

log = logging.getLogger(__name__)


@dataclass(eq=False)
class StreamConsumer(Service):
    # nats-py's pull subscription of the durable consumer (stream_setup.results_consumer).
    consumer: Any
    inbox: Inbox
    stream: str
    # The longest pause between failed fetches (they double from 0.1 s).
    fetch_pause_max_seconds: float = 2.0
    # While the inbox cannot reach the database: how often it is asked again.
    probe_seconds: float = 1.0
    # Answers waiting in the stream for the durable consumer, as the last fetch saw them
    # (the last message's num_pending; 0 when a fetch found none); None before the first.
    pending: int | None = None
    name = "stream"

    def fetch_size(self) -> int:
        """How many messages a fetch may bring: INBOX_BATCH_SIZE, fewer when the inbox's
        buffers have less room for messages as large as they may be, and no more than
        makes what the inbox holds two batches per worker: the rest waits in the stream,
        where another bridge takes it, not in this process's memory."""
        count, free = self.inbox.room()
        # A message kept until acked costs the buffer twice its size (it and its row).
        s = self.inbox.config.settings
        largest = 2 * s.inbox_max_payload_bytes
        ahead = 2 * s.inbox_batch_size * s.inbox_workers - self.inbox.held()
        return max(0, min(s.inbox_batch_size, count, free // largest, ahead))

    async def run_once(self, wait: float = 1.0) -> list[Msg]:
        """One fetch of up to fetch_size() messages, waiting up to `wait` seconds for
        the first; each is handed to the inbox (even when stopping: they are ours now).
        Raises what the fetch raised; nats' TimeoutError when nothing came."""
        if self.inbox.db_unreachable:
            # Paused: nothing is fetched until the database answers again.
            await self.release_late()
            if not await self.inbox.probe():
                await asyncio.sleep(self.probe_seconds)
                return []
        n = self.fetch_size()
        if n == 0:
            await asyncio.sleep(min(wait, 0.05))  # the inbox's workers make room
            return []
        try:
            msgs: list[Msg] = await self.consumer.fetch(n, timeout=wait)
        except TimeoutError:  # nats.errors.TimeoutError is one: nothing waits
            self.pending = 0
            raise
        if msgs:
            self.pending = msgs[-1].metadata.num_pending
        if again := sum(1 for msg in msgs if msg.metadata.num_delivered > 1):
            events.redelivered(self.inbox, again)
        for msg in msgs:
            await self.inbox.on_message(msg)
        return msgs

    async def release_late(self) -> None:
        """A fetch returns once it has messages, but its request stays open at the server
        until it expires: what the server sends to it after the inbox paused waits in the
        subscription's queue, unread. Those are handed back too, not left to the ack wait."""
        if self.consumer.pending_msgs == 0:
            return
        with contextlib.suppress(TimeoutError, NatsError):
            for msg in await self.consumer.fetch(self.consumer.pending_msgs, timeout=0.1):
                await self.inbox.on_message(msg)

    async def run(self, stopping: asyncio.Event) -> None:
        pause = 0.1
        while not stopping.is_set():
            self.beat()
            try:
                await self.run_once()
                pause = 0.1
            except TimeoutError:  # nats.errors.TimeoutError is one: nothing came
                pause = 0.1
            except (NatsError, OSError) as exc:  # disconnected, the leader moving, …
                # (Anything else is a bug, not the network: the supervisor's.)
                if not stopping.is_set():
                    log.debug("fetch from %s failed: %s", self.stream, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.fetch_pause_max_seconds)
