"""The outbox publisher (docs/behaviour.md: R-OUT-1, R-ACK-2). One transaction per
batch: claim queued jobs → publish every request → confirm the server has them → mark
them published → commit; on any failure it rolls back and the batch stays queued, so a
job is never marked published unless its message reached the server. Then overdue,
unacked jobs are republished the same way, with the same Nats-Msg-Id, or dead-lettered
past OUTBOX_MAX_REPUBLISH."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client

from arm_core.bridge import events
from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.nats_client import MSG_ID_HEADER, confirm, refusal
from arm_core.bridge.probes import Probes
from arm_core.bridge.service import Service
from arm_core.db import DatabaseError, DatabaseUnavailable
from arm_core.instruments import Metrics
from arm_core.rows import DeadLetteredJob, PacedJob, PublishedJob, UnackedJob
from arm_core.statuses import PublishOutcome
from arm_core.store import Pacing, Store

log = logging.getLogger(__name__)


class PublishFailed(Exception):
    """A batch could not be confirmed as received by NATS; it stays queued."""


class NoResponders(PublishFailed):
    """Nobody subscribes to the request subject of a probe (the server said so at once):
    the batch stays queued, and the pipeline waits for a service."""

    def __init__(self, subjects: set[str]) -> None:
        super().__init__(f"no responders on {', '.join(sorted(subjects))}")
        self.subjects = subjects


@dataclass(frozen=True)
class Cycle:
    """What one :meth:`Publisher.run_once` did (each batch committed, unless counted in
    `failed_batches`: those rolled back and changed nothing)."""

    # False: NATS was not connected, so nothing was tried.
    nats_connected: bool = True
    # False: the answers' way back was not open yet (RESULTS_STREAM's durable consumer not
    # made), so nothing was tried.
    answers_open: bool = True
    # Published and committed, in claim order.
    published: tuple[PublishedJob, ...] = ()
    # Dead-lettered at once: the request exceeds the server's max_payload.
    unpublishable: tuple[PublishedJob, ...] = ()
    # Batches NATS did not confirm (rolled back: their jobs stay as they were).
    failed_batches: int = 0
    # Whether the ack-timeout steps ran (at most every min(1 s, ACK_TIMEOUT / 4)).
    ack_checked: bool = False
    # Dead-lettered (NO_ACK) after OUTBOX_MAX_REPUBLISH republishes.
    dead_lettered: tuple[DeadLetteredJob, ...] = ()
    # Republished, overdue and unacked, with the same Nats-Msg-Id.
    republished: tuple[UnackedJob, ...] = ()


@dataclass(eq=False)
class Publisher(Service):
    config: BridgeConfig
    store: Store
    nats: Client
    # Set by a NOTIFY (bridge/listener.py) or a reconnect: a cycle runs at once.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    counts: events.Counts = field(default_factory=events.Counts)
    # The process's counters (arm_core.instruments); a service made alone has its own.
    metrics: Metrics = field(default_factory=Metrics)
    name = "publisher"
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _nats_down_since: float | None = None
    _nats_down_logged: bool = False
    _ack_checked_at: float = float("-inf")
    _active_until: float = float("-inf")
    # Probes of services that stopped answering, and the server's "no responders".
    probes: Probes = field(init=False)
    # Whether an answer sent now would be received. With RESULTS_STREAM (interest
    # retention), an answer that reaches the stream before the bridge's durable consumer
    # exists is dropped at once: nothing goes out until it does (bridge/runner.py).
    answers_open: bool = True

    def __post_init__(self) -> None:
        self.probes = Probes(self.config, self.store, self.nats)

    async def run(self, stopping: asyncio.Event) -> None:
        """Cycles until `stopping` is set; the batch in flight always finishes (commits
        or rolls back) and no new batch starts after that."""
        self._stopping = stopping
        while not stopping.is_set():
            self.beat()
            try:
                cycle = await self.run_once()
                if cycle.published or cycle.unpublishable or cycle.republished:
                    self._active_until = time.monotonic() + self.config.active_seconds
            except DatabaseError as exc:
                # An unavailable database is logged once as an outage (arm_core.db).
                level = logging.DEBUG if isinstance(exc, DatabaseUnavailable) else logging.WARNING
                log.log(level, "publisher cycle failed: %s", exc, extra={"action": "publish_cycle"})
            # Anything else is the supervisor's (bridge/service.py): logged, restarted.
            # Right after cycles that claimed jobs, poll fast: a job that joined the queue
            # while the others were published sent no NOTIFY (db/functions/10_triggers.sql).
            poll = self.config.settings.outbox_poll_seconds
            if time.monotonic() < self._active_until:
                poll = self.config.active_poll_seconds
            waits = [
                asyncio.ensure_future(self.wake.wait()),
                asyncio.ensure_future(stopping.wait()),
            ]
            try:
                await asyncio.wait(waits, timeout=poll, return_when="FIRST_COMPLETED")
            finally:
                for w in waits:
                    w.cancel()
            self.wake.clear()

    async def run_once(self) -> Cycle:
        """One cycle: publish everything queued (one batch, more only behind a full one),
        then, when due, dead-letter and republish what is overdue. Returns what it did;
        raises DatabaseError when the database failed (what committed before stays)."""
        self.counts["cycles"] += 1
        if not self.nats.is_connected:
            now = time.monotonic()
            self._nats_down_since = self._nats_down_since or now
            if (
                not self._nats_down_logged
                and now - self._nats_down_since >= self.config.nats_grace_seconds
            ):
                log.error(
                    "NATS unreachable for %.0f s; queued jobs stay queued until it is back",
                    now - self._nats_down_since,
                    extra={"action": "publish", "reason": "nats_unavailable"},
                )
                self._nats_down_logged = True
            return Cycle(nats_connected=False)
        if not self.answers_open:
            return Cycle(answers_open=False)
        if self._nats_down_logged:
            log.info("NATS is back; publishing", extra={"action": "publish"})
        self._nats_down_since, self._nats_down_logged = None, False
        # One batch first; only a full one means a backlog worth more batches in flight
        # (under a steady trickle the others would claim nothing, a wasted round trip).
        batches = [await self._publish_batch()]
        s = self.config.settings
        if len(batches[0] or ()) == s.outbox_batch_size:
            drained = await asyncio.gather(*(self._drain() for _ in range(s.outbox_publishers)))
            batches += [b for d in drained for b in d]
        claimed = [c for b in batches for c in b or ()]
        published = Cycle(
            published=tuple(c for c in claimed if c.outcome is PublishOutcome.PUBLISHED),
            unpublishable=tuple(c for c in claimed if c.outcome is PublishOutcome.DLQ),
            failed_batches=batches.count(None),
        )
        if self._stopping.is_set():
            return published
        # The ack-timeout steps need not run on every wake-up: under a steady flow of
        # uploads NOTIFY wakes the publisher every few milliseconds, and two more queries
        # each time would only delay the next publish.
        now = time.monotonic()
        if now - self._ack_checked_at < min(
            self.config.ack_check_seconds, s.ack_timeout_seconds / 4
        ):
            return published
        self._ack_checked_at = now
        dead = await self.store.dead_letter_unacked(
            ack_timeout=s.ack_timeout_seconds, max_republish=s.outbox_max_republish
        )
        if dead:
            events.dead_lettered(self, dead)
        republished: list[UnackedJob] = []
        failed = published.failed_batches
        while True:
            sent, batch_failed = await self._republish_batch()
            republished += sent
            failed += batch_failed
            if len(sent) != s.outbox_batch_size or self._stopping.is_set():
                break
        return dataclasses.replace(
            published,
            failed_batches=failed,
            ack_checked=True,
            dead_lettered=tuple(dead),
            republished=tuple(republished),
        )

    async def _drain(self) -> list[list[PublishedJob] | None]:
        """Publishes full batches until the queue is empty. OUTBOX_PUBLISHERS of these run
        at once: SKIP LOCKED gives each its own jobs, and while one batch waits for the
        server's confirmation or its commit, another is being claimed."""
        full = self.config.settings.outbox_batch_size
        batches = [await self._publish_batch()]
        while len(batches[-1] or ()) == full and not self._stopping.is_set():
            self.beat()  # a backlog of millions takes minutes: still alive
            batches.append(await self._publish_batch())
        return batches

    async def _publish_batch(self) -> list[PublishedJob] | None:
        """Publishes one batch of queued jobs in one transaction; returns what was claimed
        (None when the batch failed). A job whose request exceeds the server's max_payload
        is dead-lettered in the claim's statement: it never holds back the others."""
        c = self.config.settings

        async def send(jobs: list[PublishedJob]) -> None:
            probes = frozenset(i for i, j in enumerate(jobs) if isinstance(j, PacedJob) and j.probe)
            await self._send(jobs, "publish", probes)

        try:
            claimed = await self.store.publish_queued_jobs(
                limit=c.outbox_batch_size,
                tabular_timeout=c.tabular_reply_timeout_seconds,
                image_timeout=c.image_reply_timeout_seconds,
                tabular_subject=c.tabular_request_subject,
                image_subject=c.image_request_subject,
                max_bytes=self.nats.max_payload,
                send=send,
                # With PACING=off it claims every queued job at once, and says so in the
                # pipelines' rows.
                pacing=Pacing(
                    pacing=c.pacing,
                    tabular_min=c.tabular_min_in_flight,
                    tabular_max=c.tabular_max_in_flight,
                    image_min=c.image_min_in_flight,
                    image_max=c.image_max_in_flight,
                    ack_timeout=c.ack_timeout_seconds,
                    max_republish=c.outbox_max_republish,
                ),
            )
        except NoResponders as exc:
            await self.probes.hold(exc.subjects)
            return []
        except PublishFailed:
            return None
        self.probes.heard(claimed)
        sent = [j for j in claimed if j.outcome is PublishOutcome.PUBLISHED]
        if sent:
            events.published(self, sent)
        for job in claimed:
            if job.outcome is PublishOutcome.DLQ:
                why = f"the request cannot be published: {job.error_message}"
                events.unpublishable(self, job, why)
        return claimed

    async def _republish_batch(self) -> tuple[list[UnackedJob], bool]:
        """Republishes one batch of overdue unacked jobs in one transaction; returns what
        went out and whether the batch failed. A request that no longer fits a lowered
        max_payload is dead-lettered (REQUEST_TOO_LARGE): every overdue job ends."""
        c, limit = self.config.settings, self.nats.max_payload

        async def send(fits: list[UnackedJob]) -> list[UnackedJob]:
            await self._send(fits, "republish")
            return fits

        try:
            sent, too_large = await self.store.republish_unacked_jobs(
                limit=c.outbox_batch_size,
                ack_timeout=c.ack_timeout_seconds,
                max_republish=c.outbox_max_republish,
                max_bytes=limit,
                send=send,
            )
        except PublishFailed:
            return [], True
        if sent:
            events.republished(self, sent)
        for job in too_large:
            why = f"the request of {job.bytes} bytes exceeds the server's max_payload {limit}"
            events.unpublishable(self, job, f"{why} and cannot be republished")
        return sent, False

    async def _send(
        self,
        jobs: Sequence[PublishedJob | UnackedJob],
        action: str,
        probes: frozenset[int] = frozenset(),
    ) -> None:
        """Publishes and confirms a batch, or raises PublishFailed. Confirmed: the
        connection was up before the first publish, nats-py did not reconnect in between
        (a reconnect can drop or replay buffered data), and the server answered a PING
        sent after the last publish. The jobs at the indexes `probes` go with a reply
        subject: NoResponders when the server said nobody subscribes (bridge/probes.py)."""
        nc = self.nats
        try:
            if not nc.is_connected:
                raise PublishFailed("NATS not connected")
            reconnects = nc.stats["reconnects"]
            error_before = nc.last_error
            try:
                replies = await self.probes.replies(probes)
                for i, job in enumerate(jobs):
                    await nc.publish(
                        job.subject,
                        (job.request or "").encode(),  # JSON text (None: dead-lettered, not sent)
                        reply=replies.get(i, ""),
                        headers={MSG_ID_HEADER: job.msg_id},
                    )
                await confirm(nc)
                unheard = await self.probes.unheard(replies)
            except Exception as exc:  # nats-py raises several unrelated types here
                raise PublishFailed(f"{type(exc).__name__}: {exc}") from exc
            if not nc.is_connected or nc.stats["reconnects"] != reconnects:
                raise PublishFailed("NATS connection dropped during the batch")
            # Refused publishes never arrived: the batch must not commit as published.
            if (error := refusal(nc, error_before, "publish")) is not None:
                raise PublishFailed(
                    f"NATS refused the publish ({error}): allow this bridge's user to "
                    "publish on the request subjects (deploy/nats/nats-permissions.conf)"
                )
        except PublishFailed as exc:
            events.batch_failed(self, action, len(jobs), str(exc))
            raise
        if unheard:
            raise NoResponders({jobs[i].subject for i in unheard})
