"""The bridge: the publisher, the inbox, the NOTIFY listener and the schedule runner —
with RESULTS_STREAM also the stream's consumer and its replay — around one NATS
connection and the process's store. Each is a Service (bridge/service.py) whose loops
the bridge's one Supervisor runs and restarts. It keeps no state of its own: every
decision is a call to a SQL function."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from nats.aio.client import Client
from nats.aio.subscription import Subscription

from arm_core.bridge import events
from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.inbox import Inbox
from arm_core.bridge.listener import Listener, ListenerState
from arm_core.bridge.nats_client import confirm, connect, refusal
from arm_core.bridge.publisher import Publisher
from arm_core.bridge.replay import Recent, Replayer, keep_recent_answers
from arm_core.bridge.scheduler import Scheduler
from arm_core.bridge.service import Fatal, LoopState, Supervisor, cancel_all, stopped_within
from arm_core.bridge.stream_fetch import StreamConsumer
from arm_core.bridge.stream_setup import (
    StreamUnavailable,
    ensure_results_stream,
    results_consumer,
)
from arm_core.db import DatabaseError, Outage
from arm_core.metrics import BridgeState
from arm_core.redaction import mask_url
from arm_core.rows import BridgeInstance
from arm_core.store import Store
from arm_core.version import installed

log = logging.getLogger(__name__)


class NatsState(StrEnum):
    """The bridge's NATS side (GET /healthcheck's and /api/v1/status's `nats`)."""

    OK = "ok"  # connected and subscribed, or consuming the results stream
    REFUSED = "refused"  # connected, but the subscription or the stream was refused
    CONNECTING = "connecting"
    RECONNECTING = "reconnecting"
    DISCONNECTED = "disconnected"
    CLOSED = "closed"


@dataclass(eq=False)
class Bridge:
    config: BridgeConfig
    store: Store
    # Told once (by the supervisor) when the bridge cannot go on: RESULTS_STREAM set but
    # the server cannot hold the stream (exit 2), or a loop that crashed past
    # SERVICE_RESTART_LIMIT (exit 1). `arm-core bridge`/`serve` then stop as on SIGTERM
    # and exit with its code.
    on_fatal: Callable[[Fatal], None] = lambda fatal: None
    name: str = field(default_factory=lambda: f"arm-core@{socket.gethostname()}:{os.getpid()}")
    nats: Client = field(default_factory=Client)
    started_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    publisher: Publisher = field(init=False)
    inbox: Inbox = field(init=False)
    scheduler: Scheduler = field(init=False)
    listener: Listener = field(init=False)
    subscription: Subscription | None = None
    # The server's word when it refused the subscription (NATS user without subscribe
    # permission on RESULT_SUBJECT in NATS_QUEUE_GROUP): the bridge would hear nothing.
    subscription_refused: str | None = None
    # RESULTS_STREAM: the durable pull consumer the answers are fetched from (instead of
    # `subscription`).
    consumer: Any = None
    supervisor: Supervisor = field(init=False)
    # Connects, then subscribes or opens the stream (a supervised one-shot loop).
    _connecting: asyncio.Task[None] | None = None
    _connected: bool = False
    # RESULTS_STREAM: the answers core NATS brought lately (bridge/replay.py), the loop
    # that replays them at an election, and the loop that fetches from the consumer.
    recent: Recent | None = None
    replayer: Replayer | None = None
    stream: StreamConsumer | None = None

    def __post_init__(self) -> None:
        # The process's instruments are the store's: one set per process, however the
        # bridge and its store were made.
        instruments = self.store.instruments
        metrics = instruments.metrics
        self.supervisor = Supervisor(self.config, self.on_fatal, metrics=metrics)
        self.publisher = Publisher(self.config, self.store, self.nats, metrics=metrics)
        self.publisher.answers_open = not self.config.settings.results_stream  # until it exists
        self.inbox = Inbox(self.config, self.store, metrics=metrics, answered=self.publisher.wake)
        self.scheduler = Scheduler(self.config, self.store, report=self.instance, metrics=metrics)
        s = self.config.settings
        listen_url = s.listen_url()
        self.listener = Listener(
            listen_url,
            self.publisher.wake,
            idle_in_transaction=s.db_idle_in_transaction_timeout_seconds,
            # Another way in (DATABASE_LISTEN_URL): an outage the pool's answers do not end.
            outage=instruments.outage if listen_url == s.database_url else Outage(),
        )

    @property
    def fatal(self) -> Fatal | None:
        """Why the bridge cannot go on (also told to on_fatal)."""
        return self.supervisor.fatal

    async def start(self) -> None:
        """Starts every service; returns at once, waiting for neither the database nor
        NATS (the connection goes on in the background)."""
        self._connecting = self.supervisor.supervise(
            "nats-connect", self._connect, self.stopping, once=True
        )
        for service in (self.publisher, self.inbox, self.listener, self.scheduler):
            service.start(self.supervisor)

    async def _connect(self, stopping: asyncio.Event) -> None:
        """Connects (once), then subscribes to the result subject or opens the results
        stream; restarted by the supervisor, it picks up where it was."""
        s = self.config.settings

        def reconnected() -> None:
            self.publisher.wake.set()
            if self.replayer is not None:
                self.replayer.reconnected()

        if not self._connected:
            await connect(
                self.nats,
                s,
                self.name,
                on_reconnect=reconnected,
                on_slow_consumer=lambda: events.slow_consumer(self.inbox),
                closing=self.stopping.is_set,
            )
            self._connected = True
        if s.results_stream:
            await self._open_stream()
            return
        if self.subscription is not None:
            return
        error_before = self.nats.last_error
        self.subscription = await self.nats.subscribe(
            s.result_subject,
            queue=s.nats_queue_group,
            cb=self.inbox.on_message,
            # nats-py's own queue in front of the callback, bounded in bytes as the inbox's
            # buffer is (INBOX_BUFFER_BYTES). It fills only while the inbox waits for
            # room in its buffer, i.e. while the database is reachable but behind; past
            # it nats-py drops and the inbox counts each as `slow_consumer`.
            pending_bytes_limit=s.inbox_buffer_bytes,
        )
        await confirm(self.nats)  # the server has the SUB before we say we are subscribed
        error = refusal(self.nats, error_before, f'subscription to "{s.result_subject}"')
        if error is not None:
            self.subscription_refused = str(error)
            log.error(
                "NATS refused the subscription to %s in queue group %s (%s): this bridge "
                'receives no acks and no results; allow its user to subscribe to "%s %s" '
                "(deploy/nats/nats-permissions.conf) and restart it",
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

    async def _open_stream(self) -> None:
        """RESULTS_STREAM: ensures the stream and the shared durable consumer, then starts
        the loop that fetches from it into the inbox (bridge/stream_fetch.py) and the
        replay's. The inbox acks each message once its envelope's outcome is final
        (committed); what it never settles comes again."""
        if self.stream is not None:
            return
        c, s = self.config, self.config.settings
        while True:
            try:
                js = await ensure_results_stream(self.nats, s)
                consumer = self.consumer or await results_consumer(
                    js, s, pending_bytes_limit=s.inbox_buffer_bytes
                )
                break
            except StreamUnavailable as exc:
                log.error("%s", exc, extra={"action": "stream_unavailable"})
                # Until it stops, it says `refused`.
                self.supervisor.fail(Fatal(str(exc), exit_code=2))
                return
            except Exception as exc:
                # No answer from the JetStream API: a cluster electing its leader, a
                # connection moving, or a user not allowed $JS.API (the server refuses
                # silently; deploy/nats/nats-permissions.conf allows what it needs).
                log.warning(
                    "JetStream does not answer for stream %s yet (%s); trying again",
                    s.results_stream,
                    f"{type(exc).__name__}: {exc}",
                    extra={"action": "stream_waiting"},
                )
                if await stopped_within(self.stopping, c.stream_retry_seconds):
                    return
        self.inbox.acks = True
        self.consumer = consumer
        self.publisher.answers_open = True
        if s.results_stream_replay_seconds > 0 and self.recent is None:
            self.recent, self.replayer = await keep_recent_answers(
                self.nats, c, self.inbox, self.supervisor
            )
        log.info(
            "connected to NATS %s, consuming %s from stream %s (durable consumer %s)",
            mask_url(self.nats.connected_url.netloc) if self.nats.connected_url else "?",
            s.result_subject,
            s.results_stream,
            s.nats_queue_group,
            extra={"action": "nats_connected"},
        )
        self.publisher.wake.set()
        self.stream = StreamConsumer(
            consumer,
            self.inbox,
            s.results_stream,
            fetch_pause_max_seconds=c.fetch_pause_max_seconds,
        )
        self.stream.start(self.supervisor)

    def nats_state(self) -> NatsState:
        if self.fatal is not None and self.fatal.exit_code == 2:  # the server cannot do it
            return NatsState.REFUSED
        if self.nats.is_connected and self.consumer is not None:
            return NatsState.OK
        if self.nats.is_connected and self.subscription is not None:
            return NatsState.REFUSED if self.subscription_refused else NatsState.OK
        if self.nats.is_reconnecting:
            return NatsState.RECONNECTING
        if self.nats.is_closed and self.subscription is not None:
            return NatsState.CLOSED
        return NatsState.CONNECTING if self.subscription is None else NatsState.DISCONNECTED

    def listener_status(self) -> ListenerState:
        return ListenerState.STOPPED if self.listener.ended() else self.listener.state

    def instance(self) -> BridgeInstance:
        """This bridge's row of arm.bridge_instance (what a console without a bridge of
        its own shows); `loops`: those restarting, stalled or failed, as GET /livez says."""
        _, said = self.supervisor.live()
        troubled = (LoopState.RESTARTING, LoopState.STALLED, LoopState.FAILED)
        states = self.supervisor.states()
        return BridgeInstance(
            name=self.name,
            version=installed(),
            started_at=self.started_at,
            seen_seconds_ago=0.0,
            nats=self.nats_state(),
            listener=self.listener_status(),
            loops={name: said[name] for name, state in states.items() if state in troubled},
            held=self.inbox.held(),
        )

    def metrics_state(self) -> BridgeState:
        pending = self.stream.pending if self.stream is not None else None
        return BridgeState(self.nats_state() is NatsState.OK, self.inbox.held(), pending)

    async def stop(self, grace: float | None = None) -> None:
        """Leaves the exchange without losing what it holds, in this order (up to `grace`
        seconds in all; the config's stop_grace_seconds when None):

        1. the publisher, listener and schedule runner stop (and, with RESULTS_STREAM,
           the fetches and replays: what they fetched is handed to the inbox); the
           publisher's batch in flight commits or rolls back — no new requests go out;
        2. the subscription leaves the queue group by draining; from its UNSUB on the
           server gives the answers to the group's other members;
        3. the inbox applies everything it holds, batch by batch, each committed;
        4. NATS is closed.

        Until step 2 answers to the requests it published keep arriving here and are
        applied. An envelope is dropped (counted, logged with its job id) only when the
        grace runs out or the database stays unreachable past it. The one gap (nats-py's
        drain) is in docs/not-losing-answers.md."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.config.stop_grace_seconds if grace is None else grace)

        def left() -> float:
            return max(0.0, deadline - loop.time())

        self.stopping.set()
        if self._connecting is not None:  # still waiting for a server or the stream?
            await cancel_all([self._connecting])
        feeders = [s for s in (self.stream, self.replayer) if s is not None]
        await asyncio.gather(
            *(s.stop(left()) for s in (self.publisher, self.listener, self.scheduler, *feeders))
        )
        if self.subscription is not None and self.nats.is_connected:
            # nats-py's drain(), not unsubscribe(): UNSUB, a PING round trip, then every
            # message nats-py has queued for the subscription (hundreds, when the inbox is
            # behind) through the callback into the inbox before the subscription goes.
            try:
                await asyncio.wait_for(self.subscription.drain(), left())
                log.info(
                    "left queue group %s on %s; applying what is held",
                    self.config.settings.nats_queue_group,
                    self.config.settings.result_subject,
                    extra={"action": "nats_drained", "count": self.inbox.buffered()},
                )
            except Exception as exc:
                log.warning(
                    "could not drain the subscription to %s (%s): messages still in "
                    "transit to this bridge may be lost",
                    self.config.settings.result_subject,
                    f"{type(exc).__name__}: {exc}",
                    extra={"action": "nats_drain_failed"},
                )
        await self.inbox.stop(left())
        if self._connected and not self.nats.is_closed:
            await self.nats.close()
        # A bridge that stopped cleanly is not one that stopped saying it is alive: its row
        # of arm.bridge_instance goes (when the database cannot be reached it stays, and
        # grows old like a dead bridge's).
        try:
            await self.store.forget_bridge(self.name, min(2.0, max(0.5, left())))
        except (DatabaseError, TimeoutError) as exc:
            log.warning(
                "could not remove this bridge from arm.bridge_instance: %s",
                exc,
                extra={"action": "bridge_forget_failed"},
            )
        log.info(
            "bridge stopped",
            extra={"action": "bridge_stopped", "count": self.inbox.dropped()},
        )
