"""RESULTS_STREAM: the loop that fetches answers from the durable consumer every bridge
shares and hands them to the inbox, which acks each once its outcome is final
(bridge/inbox.py). What it never settles comes again after the consumer's ack wait.

One fetch is one step, :meth:`StreamConsumer.run_once`: it returns the messages it
handed over. The loop calls it; so can a test."""

from __future__ import annotations

import asyncio
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
    # nats-py's pull subscription of the durable consumer (bridge/nats_client.py
    # results_consumer).
    consumer: Any
    inbox: Inbox
    stream: str
    batch_size: int = 500
    # The longest pause between failed fetches (they double from 0.1 s).
    fetch_pause_max_seconds: float = 2.0
    name = "stream"

    async def run_once(self, wait: float = 1.0) -> list[Msg]:
        """One fetch of up to batch_size messages, waiting up to `wait` seconds for
        the first; each is handed to the inbox (even when stopping: they are ours now).
        Raises what the fetch raised; nats' TimeoutError when nothing came."""
        self.fault("stream")
        msgs: list[Msg] = await self.consumer.fetch(self.batch_size, timeout=wait)
        again = sum(1 for msg in msgs if msg.metadata.num_delivered > 1)
        if again:
            events.redelivered(self.inbox.counts, again)
        for msg in msgs:
            await self.inbox.on_message(msg)
        return msgs

    async def run(self, stopping: asyncio.Event) -> None:
        pause = 0.1
        while not stopping.is_set():
            self.beat()
            try:
                await self.run_once()
            except TimeoutError:  # nats.errors.TimeoutError is one: nothing came
                pause = 0.1
                continue
            except (NatsError, OSError) as exc:  # disconnected, the leader moving, …
                # (Anything else is a bug, not the network: the supervisor's.)
                if not stopping.is_set():
                    log.debug("fetch from %s failed: %s", self.stream, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.fetch_pause_max_seconds)
                continue
            pause = 0.1
