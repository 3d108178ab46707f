"""The inbox's intake: what it does with an answer before the database sees it.

The subscription callback (:meth:`Intake.on_message`) parses and validates, then puts the
envelope in its worker's buffer (by job id, so a job's envelopes stay in order), waiting
for room while the database is reachable; during an outage, and once the worker has
stopped, it lets envelopes go instead: a message of the results stream is handed back to
it (a NAK), any other is dropped — counted and logged once per burst. It also settles
the stream's messages with the server, and tells whether the database answers again.

bridge/inbox.py's :class:`~arm_core.bridge.inbox.Inbox` is this intake plus the workers
that apply the buffers in batches."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from arm_core.bridge import events
from arm_core.bridge.buffer import Buffer, DropBursts, Waiting
from arm_core.bridge.config import InboxConfig
from arm_core.bridge.envelope import Envelope, Rejected, parse_envelope
from arm_core.bridge.service import Service
from arm_core.db import DatabaseError
from arm_core.instruments import Metrics
from arm_core.store import Store

log = logging.getLogger(__name__)


# A message handed back to the results stream is delivered again after this long: more
# than a fetch of this bridge's stays open at the server (bridge/stream.py waits 1 s),
# so that it goes to another bridge's fetch, not into one this bridge opened just before
# it stepped aside — where it would sit, unread, until the consumer's ack wait.
HAND_BACK_DELAY_SECONDS = 2.0


@dataclass(eq=False)
class Intake(Service):
    """The inbox's state and what it does before the database sees an answer."""

    config: InboxConfig
    store: Store
    counts: events.Counts = field(default_factory=events.Counts)
    # The process's counters (arm_core.instruments); a service made alone has its own.
    metrics: Metrics = field(default_factory=Metrics)
    name = "inbox"
    # One buffer and one worker per INBOX_WORKERS; a job's envelopes always share one
    # (by job id), so their order holds while the workers' batches run side by side.
    # Each holds its share of INBOX_BUFFER_SIZE envelopes and INBOX_BUFFER_BYTES.
    queues: list[Buffer] = field(init=False)
    # Set while the worker holds a batch because the database is unreachable.
    db_unreachable: bool = False
    # Per worker, the envelopes that lead its next batch, before anything in its buffer:
    # those that came back `busy`, or the one its loop waited for.
    _leading: list[list[Envelope]] = field(init=False)
    # True when the messages come from the results stream: each is settled with the
    # server once its envelope's outcome is final.
    acks: bool = False
    # Envelopes lost before the database saw them, told once per burst.
    drops: DropBursts = field(default_factory=DropBursts)
    # Set when a batch applied an answer: a job left the service's hands, so a paced
    # pipeline has room again (the runner hands the publisher's wake-up event here).
    answered: asyncio.Event | None = None
    # Per worker, the answers whose job was still queued, to be applied again later.
    _waiting: list[Waiting] = field(init=False)
    # Per worker: its loop crashed with a batch in hand, which it applies one envelope at
    # a time once restarted.
    _suspect: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        s = self.config.settings
        n = s.inbox_workers
        self.queues = [
            Buffer(max(1, s.inbox_buffer_size // n), max(1, s.inbox_buffer_bytes // n))
            for _ in range(n)
        ]
        self._leading = [[] for _ in range(n)]
        self._waiting = [Waiting() for _ in range(n)]
        self._suspect = [False] * n

    def worker_name(self, worker: int) -> str:
        return f"{self.name}-{worker}"

    def worker_running(self, worker: int) -> bool:
        """Whether the worker's loop runs, or will again after a restart (True for an
        inbox whose loops were never started: a test steps it)."""
        supervisor = self.supervisor
        return not self.tasks or supervisor is None or supervisor.running(self.worker_name(worker))

    def buffered(self) -> int:
        """Envelopes waiting in the buffers."""
        return sum(q.qsize() for q in self.queues)

    def held(self) -> int:
        """Envelopes received and not applied yet: in the buffers, or in a worker's hands
        (its batch, held while the database is away; those waiting for a busy job)."""
        held = sum(len(batch) for batch in self._leading)
        return self.buffered() + held + sum(len(w) for w in self._waiting)

    def buffered_bytes(self) -> int:
        """What the envelopes waiting in the buffers came as, in bytes."""
        return sum(q.bytes for q in self.queues)

    def room(self) -> tuple[int, int]:
        """How many more envelopes, and bytes, the buffers take now, all together."""
        rooms = [q.room() for q in self.queues]
        return sum(r[0] for r in rooms), sum(r[1] for r in rooms)

    def dropped(self) -> int:
        """Envelopes lost before the database saw them, whatever the reason."""
        return sum(n for key, n in self.counts.items() if key.startswith("dropped."))

    async def on_message(self, msg: Msg, settle: bool = True) -> None:
        """nats-py subscription callback: never raises. Waits for room in the buffer
        while the database is reachable and the buffer's worker runs (or restarts);
        drops (counted, logged) during an outage, and once the worker has stopped.
        `settle=False`: a core NATS message handed in while the answers come from the
        results stream (bridge/replay.py), with nothing to acknowledge."""
        settle = settle and self.acks
        self.counts["received"] += 1
        try:
            parsed = parse_envelope(
                msg.data, msg.headers, self.config.settings.inbox_max_payload_bytes
            )
        except Exception as exc:  # a bug here must not kill the subscription
            parsed = Rejected("parse_error", f"{type(exc).__name__}: {exc}")
        if isinstance(parsed, Rejected):
            events.rejected(self, msg.subject, parsed)
            if settle:
                await self._settle(msg, terminate=True)
            return
        if parsed.made_storable:
            events.made_storable(self, parsed)
        if parsed.msg_id_derived:
            events.ack_without_msg_id(self, parsed)
        if parsed.truncated:
            events.truncated(self, parsed)
        if settle:
            # Kept until acked: the message counts against the buffer as well as its row.
            parsed = dataclasses.replace(parsed, msg=msg, size=parsed.size + len(msg.data))
        worker = parsed.job_id.int % len(self.queues)
        queue = self.queues[worker]
        if parsed.msg is not None and self.db_unreachable:
            await self.let_go([parsed], "buffer_full")  # another bridge may reach it
            return
        while not queue.put_nowait(parsed):
            if self.db_unreachable:
                await self.let_go([parsed], "buffer_full")
                return
            if not self.worker_running(worker):  # nobody will make room
                await self.let_go([parsed], "shutdown")
                return
            # The database is there, the worker is only behind: wait for room.
            if await queue.put(parsed, self.config.full_recheck_seconds):
                break

    async def let_go(self, envelopes: list[Envelope], reason: str) -> None:
        """Envelopes this inbox will not apply (`reason`: buffer_full, shutdown). Those
        from the results stream are handed back to it (a NAK: the stream delivers them
        again after HAND_BACK_DELAY_SECONDS, to whichever bridge fetches — one that
        reaches its database);
        the others are lost before the database saw them: counted, logged once per
        burst."""
        returned = [e for e in envelopes if e.msg is not None]
        for envelope in envelopes:
            if envelope.msg is None:
                s, why = self.config.settings, events.DROPPED_BECAUSE.get(reason, reason)
                said = why.format(size=s.inbox_buffer_size, bytes=s.inbox_buffer_bytes)
                self.drops.dropped(envelope, reason, said)
                events.dropped(self, envelope, reason)
        for envelope in returned:
            assert envelope.msg is not None
            await self._settle(envelope.msg, hand_back=True)
        if returned:
            events.handed_back(self, len(returned), reason)

    async def step_aside(self) -> int:
        """The database is unreachable: hands every message of the results stream the
        buffers hold back to it (core NATS ones stay: nothing would deliver them
        again); returns how many."""
        returned = [e for q in self.queues for e in q.take(lambda e: e.msg is not None)]
        if returned:
            await self.let_go(returned, "buffer_full")
        return len(returned)

    async def probe(self, within: float = 2.0) -> bool:
        """Whether the database answers now (one cheap read, within `within` seconds);
        when it does, the inbox takes answers again."""
        try:
            async with asyncio.timeout(within):
                await self.store.answers(pool_timeout=within / 2)
        except (DatabaseError, TimeoutError):
            return False
        self.reachable()
        return True

    def reachable(self) -> None:
        """The database answered."""
        if self.db_unreachable:
            self.db_unreachable = False
            if self.acks:
                events.intake_resumed(self)
        if self.drops:
            self.drops.ended()

    async def stop(self, grace: float) -> None:
        await super().stop(grace)
        if self.drops:
            self.drops.ended()

    def slow_consumer(self) -> None:
        """nats-py dropped a message because its subscription queue was full."""
        events.slow_consumer(self)

    async def _settle(self, msg: Msg, terminate: bool = False, hand_back: bool = False) -> None:
        """Acks (or terminates, or hands back: a NAK) a message of the results stream. A
        lost ack only means the message comes again: the database then calls it a
        duplicate."""
        try:
            if hand_back:
                await msg.nak(delay=HAND_BACK_DELAY_SECONDS)
                return
            if terminate:
                await msg.term()
            else:
                await msg.ack()
            events.settled(self, terminate)
        except Exception as exc:
            log.warning(
                "could not settle a message of the results stream (it comes again): %s",
                f"{type(exc).__name__}: {exc}",
                extra={"action": "stream_ack_failed"},
            )
