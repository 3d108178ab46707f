"""Test support for driving the bridge one step at a time: a connection pool,
a publisher on a NATS connection of its own, what a real subscriber received, and an
inbox fed the way the bridge's subscription feeds it.

Nothing here runs the bridge's loops. A step test calls `Publisher.run_once`,
`Inbox.run_once` or `Scheduler.run_once` itself and asserts on what it returned and on
the database; it never waits for a poll or a tick. Messages still go through a real
nats-server, and they are taken in without polling: a PING/PONG on the receiving
connection proves that every message the server routed to it before has arrived (the
server writes a connection's messages and its PONG in order), so what a subscription
holds after a flush is everything sent before it.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.contracts import REQUEST_SCHEMA, validator
from arm_core.bridge.envelope import Envelope
from arm_core.bridge.inbox import EnvelopeOutcome, Inbox
from arm_core.bridge.nats_client import connect
from arm_core.bridge.publisher import Publisher
from arm_core.devtools.testbed.sql import BRIDGE_LOGIN, as_login
from arm_core.statuses import ApplyOutcome, JobStatus
from arm_core.store import Store
from tests.support.bridge import fast_settings

# Settings for a step that never connects to NATS itself (an inbox, a scheduler).
NO_NATS = "nats://127.0.0.1:1"

REQUEST_SUBJECTS = ("files.tabular_uploaded", "files.img_uploaded")


@contextlib.asynccontextmanager
async def step_pool(
    db_url: str, pool_timeout: float = 5.0, max_size: int = 3
) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """A connection pool as the bridge opens one: as the bridge's login (a member of
    arm_bridge only, so a step has the bridge's privileges and no more), autocommit,
    `pool_timeout` the wait for a connection before the database counts as unreachable
    (or, every connection in use, the pool as exhausted), at most `max_size` connections;
    its first connection made before the body runs. `db_url` is the superuser's URL the
    test's own connections use."""
    async with AsyncConnectionPool(
        as_login(db_url, BRIDGE_LOGIN),
        open=False,
        min_size=1,
        max_size=max_size,
        timeout=pool_timeout,
        kwargs={"autocommit": True},
    ) as pool:
        await pool.wait()
        yield pool


@contextlib.asynccontextmanager
async def publisher(
    db_url: str, nats_url: str, pool: AsyncConnectionPool[Any], **settings: Any
) -> AsyncIterator[Publisher]:
    """A publisher (fast_settings plus `settings`) on a NATS connection of its own, made
    as the bridge makes its own (arm_core.bridge.nats_client.connect: it reconnects, and
    a publish while disconnected raises instead of being buffered); closed afterwards.
    Its loop never runs."""
    config = fast_settings(db_url, nats_url, **settings)
    nc = Client()
    closing = False
    await connect(nc, config, "publisher-step", closing=lambda: closing)
    try:
        yield Publisher(BridgeConfig(config), Store(pool), nc)
    finally:
        closing = True
        await nc.close()


async def _flush(client: Client) -> None:
    # Twice: nats-py's PING can overtake what it has buffered; the second PONG cannot.
    await client.flush()
    await client.flush()


async def _drain(client: Client, *subs: Subscription) -> list[Msg]:
    """Every message the server routed to `subs` before now, subscription by
    subscription, each in the order the server sent them."""
    await _flush(client)
    return [await sub.next_msg(timeout=5) for sub in subs for _ in range(sub.pending_msgs)]


@dataclass
class Received:
    """Messages on some subjects as a real subscriber gets them, taken when asked.

    `take()` returns everything that reached the server before the call and was not
    taken yet: after a publisher step returns, the server has confirmed its messages,
    so they are all there — none is waited for, and none can still be on its way."""

    client: Client
    subs: list[Subscription]
    messages: list[Msg]

    async def take(self) -> list[Msg]:
        new = await _drain(self.client, *self.subs)
        self.messages += new
        return new

    def msg_ids(self) -> list[str]:
        return [(m.headers or {}).get("Nats-Msg-Id", "") for m in self.messages]

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(m.data) for m in self.messages]

    def assert_valid_requests(self) -> None:
        """Every request passes the request schema, its Nats-Msg-Id is job_id:attempt
        and it went out on its pipeline's subject."""
        for msg, body in zip(self.messages, self.bodies(), strict=True):
            validator(REQUEST_SCHEMA).validate(body)
            assert (msg.headers or {})["Nats-Msg-Id"] == f"{body['job_id']}:{body['attempt']}"
            assert msg.subject == REQUEST_SUBJECTS[body["pipeline"] != "tabular"]


async def receive(client: Client, *subjects: str) -> Received:
    """Subscribes `client` to `subjects` (by default both request subjects)."""
    subs = [await client.subscribe(s) for s in subjects or REQUEST_SUBJECTS]
    await _flush(client)  # the server has the SUBs before anything is published
    return Received(client, subs, [])


@dataclass
class InboxFeed:
    """Envelopes into an inbox the way the bridge hands them over: published on the
    result subject through a real nats-server, taken off the test's own subscription and
    given to `Inbox.on_message` — the bridge's subscription callback, which parses,
    validates, counts and buffers. The inbox's worker loop never runs: `step()` is one
    `Inbox.run_once`."""

    inbox: Inbox
    client: Client
    sub: Subscription
    subject: str

    async def send(self, body: dict[str, Any] | bytes, msg_id: str | None) -> None:
        """Publishes an envelope (or any bytes; `msg_id` None sends no Nats-Msg-Id)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Nats-Msg-Id": msg_id} if msg_id is not None else None
        await self.client.publish(self.subject, data, headers=headers)

    async def deliver(self) -> int:
        """Hands every message sent so far to the inbox's callback, one by one and in
        order (each call returns once the envelope is buffered, rejected or dropped);
        returns how many."""
        messages = await _drain(self.client, self.sub)
        for msg in messages:
            await self.inbox.on_message(msg)
        return len(messages)

    async def put(self, body: dict[str, Any] | bytes, msg_id: str | None) -> None:
        """send() and deliver() for one envelope."""
        await self.send(body, msg_id)
        assert await self.deliver() == 1

    async def step(self) -> InboxStep:
        return await inbox_step(self.inbox)


async def inbox_feed(
    client: Client, db_url: str, pool: AsyncConnectionPool[Any], **settings: Any
) -> InboxFeed:
    """An inbox of one worker (fast_settings plus `settings`) fed through `client`."""
    given = fast_settings(db_url, NO_NATS, **{"inbox_workers": 1, **settings})
    inbox = Inbox(BridgeConfig(given), Store(pool))
    sub = await client.subscribe(given.result_subject)
    await _flush(client)
    return InboxFeed(inbox, client, sub, given.result_subject)


@dataclass(frozen=True)
class InboxStep:
    """What one batch of each worker of an inbox did, the workers one after the other:
    every envelope's outcome, in the order applied."""

    results: tuple[EnvelopeOutcome, ...]

    @property
    def deferred(self) -> tuple[Envelope, ...]:
        """Those that came back `busy`: they lead their worker's next batch."""
        return tuple(r.envelope for r in self.results if r.outcome is ApplyOutcome.BUSY)

    def outcomes(self) -> Counter[ApplyOutcome]:
        return Counter(r.outcome for r in self.results)


async def inbox_step(inbox: Inbox) -> InboxStep:
    """Inbox.run_once of each worker in turn."""
    results: list[EnvelopeOutcome] = []
    for worker in range(len(inbox.queues)):
        results += await inbox.run_once(worker)
    return InboxStep(tuple(results))


def outcomes(step: InboxStep) -> list[tuple[ApplyOutcome, JobStatus | None]]:
    """Each envelope's outcome and its job's status after, in the order applied."""
    return [(r.outcome, r.status) for r in step.results]
