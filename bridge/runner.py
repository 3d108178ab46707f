"""The bridge: publisher, inbox, NOTIFY listener and schedule runner as asyncio tasks
around one NATS connection and the shared connection pool. It keeps no state of its
own: every decision is a call to a SQL function."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.aio.subscription import Subscription
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.inbox import Inbox
from arm_core.bridge.listener import listen_for_queued_jobs
from arm_core.bridge.nats_client import (
    StreamUnavailable,
    confirm,
    connect,
    ensure_results_stream,
    results_consumer,
)
from arm_core.bridge.publisher import Publisher
from arm_core.bridge.scheduler import Scheduler
from arm_core.config import Settings, mask_url
from arm_core.db import DatabaseError
from arm_core.metrics import BridgeState

log = logging.getLogger(__name__)


@dataclass
class Bridge:
    settings: Settings
    pool: AsyncConnectionPool[Any]
    name: str = field(default_factory=lambda: f"arm-core@{socket.gethostname()}:{os.getpid()}")
    nats: Client = field(default_factory=Client)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Set by stop() only once the subscription is drained: the inbox's workers end when
    # it is set and their buffers are empty, so nothing received is left unapplied.
    inbox_stopping: asyncio.Event = field(default_factory=asyncio.Event)
    publisher: Publisher = field(init=False)
    inbox: Inbox = field(init=False)
    scheduler: Scheduler = field(init=False)
    subscription: Subscription | None = None
    # The server's word when it refused the subscription (NATS user without subscribe
    # permission on RESULT_SUBJECT in NATS_QUEUE_GROUP): the bridge would hear nothing.
    subscription_refused: str | None = None
    # RESULTS_STREAM: the durable pull consumer the answers are fetched from (instead of
    # `subscription`).
    consumer: Any = None
    # Why the process must stop at once (RESULTS_STREAM set, but the server cannot hold
    # the stream); the command then exits 2 with it (arm_core/cli.py).
    fatal: str | None = None
    # The LISTEN connection: connecting, ok, reconnecting (bridge/listener.py).
    listener_state: str = "connecting"
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.publisher = Publisher(self.settings, self.pool, self.nats)
        self.inbox = Inbox(self.settings, self.pool)
        self.scheduler = Scheduler(self.settings, self.pool)

    async def start(self) -> None:
        """Starts every task; returns at once (NATS may still be connecting)."""
        try:
            await self.scheduler.apply_settings()
        except DatabaseError as exc:
            log.warning("could not apply TIMEOUT_SWEEP_SECONDS yet: %s", exc)
        url = self.settings.require_database_url()
        self._tasks = [
            asyncio.create_task(self._connect(), name="nats-connect"),
            asyncio.create_task(self.publisher.run(self.stopping), name="publisher"),
            asyncio.create_task(self.inbox.run(self.inbox_stopping), name="inbox"),
            asyncio.create_task(
                listen_for_queued_jobs(
                    url, self.publisher.wake, self.stopping, on_state=self._listener_is
                ),
                name="listen",
            ),
            asyncio.create_task(self.scheduler.run(self.stopping), name="schedule"),
        ]

    async def _connect(self) -> None:
        s = self.settings

        async def on_state(event: str) -> None:
            if event == "reconnected":
                self.publisher.wake.set()
            elif event == "slow_consumer":
                self.inbox.slow_consumer()

        await connect(self.nats, s, self.name, on_state, closing=self.stopping.is_set)
        if s.results_stream:
            await self._consume_stream()
            return
        error_before = self.nats.last_error
        self.subscription = await self.nats.subscribe(
            s.result_subject,
            queue=s.nats_queue_group,
            cb=self.inbox.on_message,
            # nats-py's own queue in front of the callback (its defaults: 512 Ki messages,
            # 128 MiB). It fills only while the inbox waits for room in its buffer, i.e.
            # while the database is reachable but behind; past it nats-py drops and the
            # inbox counts each drop as `slow_consumer`.
        )
        await confirm(self.nats)  # the server has the SUB before we say we are subscribed
        # A refused SUB leaves the connection up; the server's -ERR comes before the PONG
        # and nats-py only passes it to the error callback (and keeps it as last_error).
        error = self.nats.last_error
        refusal = f'permissions violation for subscription to "{s.result_subject}"'.lower()
        if error is not None and error is not error_before and refusal in str(error).lower():
            self.subscription_refused = str(error)
            log.error(
                "NATS refused the subscription to %s in queue group %s (%s): this bridge "
                'receives no acks and no results; allow its user to subscribe to "%s %s" '
                "(docs/nats-permissions.conf) and restart it",
                s.result_subject,
                s.nats_queue_group,
                error,
                s.result_subject,
                s.nats_queue_group,
                extra={"action": "nats_subscribe_refused"},
            )
            return
        log.info(
            "connected to NATS %s, subscribed to %s in queue group %s",
            # user:password@host:port as nats-py has it: the password (or token) masked
            mask_url(self.nats.connected_url.netloc) if self.nats.connected_url else "?",
            s.result_subject,
            s.nats_queue_group,
            extra={"action": "nats_connected"},
        )
        self.publisher.wake.set()

    async def _consume_stream(self) -> None:
        """RESULTS_STREAM: ensures the stream and the shared durable consumer, then fetches
        batches from it into the inbox until stopping. The inbox acks each message once
        its envelope's outcome is final (committed); what it never settles comes again."""
        s = self.settings
        while True:
            try:
                js = await ensure_results_stream(self.nats, s)
                consumer = await results_consumer(js, s)
                break
            except StreamUnavailable as exc:
                self.fatal = str(exc)
                log.error("%s", exc, extra={"action": "stream_unavailable"})
                # The process's own SIGTERM handler (arm-core serve/bridge) stops it and
                # the command exits 2; where none is installed (a bridge inside a test)
                # the bridge only stays unhealthy (`refused`).
                if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN):
                    signal.raise_signal(signal.SIGTERM)
                return
            except Exception as exc:
                # No answer from the JetStream API: a cluster electing its leader, a
                # connection moving, or a user not allowed $JS.API (the server refuses
                # silently; docs/nats-permissions.conf has the RESULTS_STREAM variant).
                log.warning(
                    "JetStream does not answer for stream %s yet (%s); trying again",
                    s.results_stream,
                    f"{type(exc).__name__}: {exc}",
                    extra={"action": "stream_waiting"},
                )
                try:
                    await asyncio.wait_for(self.stopping.wait(), 2.0)
                    return
                except TimeoutError:
                    continue
        self.inbox.acks = True
        self.consumer = consumer
        log.info(
            "connected to NATS %s, consuming %s from stream %s (durable consumer %s)",
            mask_url(self.nats.connected_url.netloc) if self.nats.connected_url else "?",
            s.result_subject,
            s.results_stream,
            s.nats_queue_group,
            extra={"action": "nats_connected"},
        )
        self.publisher.wake.set()
        pause = 0.1
        while not self.stopping.is_set():
            try:
                msgs = await consumer.fetch(s.inbox_batch_size, timeout=1)
            except TimeoutError:  # nats.errors.TimeoutError is one: nothing came
                pause = 0.1
                continue
            except Exception as exc:  # disconnected, the stream's leader moving, …
                if not self.stopping.is_set():
                    log.debug("fetch from %s failed: %s", s.results_stream, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
                continue
            pause = 0.1
            for msg in msgs:  # handed over even when stopping: they are ours now
                await self.inbox.on_message(msg)

    def nats_state(self) -> str:
        """`ok` when connected and subscribed (or consuming the results stream), `refused`
        when connected but the server refused the subscription (or cannot hold the
        stream); otherwise what it is doing."""
        if self.fatal:
            return "refused"
        if self.nats.is_connected and self.consumer is not None:
            return "ok"
        if self.nats.is_connected and self.subscription is not None:
            return "refused" if self.subscription_refused else "ok"
        if self.nats.is_reconnecting:
            return "reconnecting"
        if self.nats.is_closed and self.subscription is not None:
            return "closed"
        return "connecting" if self.subscription is None else "disconnected"

    def _listener_is(self, state: str) -> None:
        self.listener_state = state

    def listener_status(self) -> str:
        """The LISTEN connection's state; `stopped` when its task has ended."""
        listen = next((t for t in self._tasks if t.get_name() == "listen"), None)
        if listen is not None and listen.done():
            return "stopped"
        return self.listener_state

    def metrics_state(self) -> BridgeState:
        """arm_nats_connected (connected and subscribed) and arm_inbox_buffered."""
        return BridgeState(self.nats_state() == "ok", self.inbox.buffered())

    async def stop(self, grace: float = 10.0) -> None:
        """Leaves the exchange without losing what it holds, in this order (up to `grace`
        seconds in all):

        1. the publisher, listener and schedule runner stop; the publisher's batch in
           flight commits or rolls back — no new requests go out;
        2. the subscription leaves the queue group by draining (nats-py's
           Subscription.drain): UNSUB, a round trip, then every message nats-py holds for
           it handed to the inbox before the subscription goes. From the UNSUB on the
           server gives the answers to the group's other members;
        3. the inbox applies everything it holds, batch by batch, each committed;
        4. NATS is closed.

        Until step 2 the bridge stays subscribed, so answers to the requests it
        published keep arriving here and are applied. An envelope is dropped (counted,
        logged with its job id) only when the grace runs out or the database stays
        unreachable past it.

        One gap is nats-py's: drain() writes its PING ahead of the UNSUB, so an answer
        the server routes here between the two (a round trip at most) reaches nats-py
        after the subscription is gone and is lost — core NATS does not deliver it
        again. RESULTS_STREAM (a durable consumer: what is not acked comes again) is
        the setting for losing none."""
        deadline = asyncio.get_running_loop().time() + grace

        def left() -> float:
            return max(0.0, deadline - asyncio.get_running_loop().time())

        self.stopping.set()
        connecting = self._tasks[0] if self._tasks else None
        if connecting is not None and not connecting.done() and self.consumer is None:
            connecting.cancel()  # still waiting for a server: nothing to finish there
        others = [t for t in self._tasks if t.get_name() != "inbox"]
        if others:
            await asyncio.wait(others, timeout=left())
        if self.subscription is not None and self.nats.is_connected:
            try:
                await asyncio.wait_for(self._drain_subscription(self.subscription), left())
            except Exception as exc:
                log.warning(
                    "could not drain the subscription to %s (%s): messages still in "
                    "transit to this bridge may be lost",
                    self.settings.result_subject,
                    f"{type(exc).__name__}: {exc}",
                    extra={"action": "nats_drain_failed"},
                )
        self.inbox_stopping.set()
        done, pending = await asyncio.wait(self._tasks, timeout=left()) if self._tasks else ((), ())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("bridge task %s ended with %r", task.get_name(), task.exception())
        connected_once = self.subscription is not None or self.consumer is not None
        if (connected_once or self.fatal) and not self.nats.is_closed:
            await self.nats.close()
        log.info(
            "bridge stopped",
            extra={"action": "bridge_stopped", "count": sum(self.inbox.stats.dropped.values())},
        )

    async def _drain_subscription(self, sub: Subscription) -> None:
        """Leaves the queue group through nats-py's public drain(): UNSUB, a PING round
        trip, then every message nats-py has queued for the subscription (hundreds, when
        the inbox is behind) through the callback into the inbox, before nats-py removes
        the subscription. A plain unsubscribe() would throw that queue away."""
        await sub.drain()
        log.info(
            "left queue group %s on %s; applying what is held",
            self.settings.nats_queue_group,
            self.settings.result_subject,
            extra={"action": "nats_drained", "count": self.inbox.buffered()},
        )
