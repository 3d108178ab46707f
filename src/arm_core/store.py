"""The store: the one object through which a process sends its queries.

A process makes one :class:`Store` on its connection pool and hands it to every service
and handler (src/arm_core/runtime.py); nothing else holds the pool. Each public method is
one runtime operation: it sends the named queries of src/arm_core/queries.sql it needs
(tests/integration/test_store.py: each query is sent by exactly one method, and every
method is called by the runtime or the admin code), owns its transaction, and turns
driver errors into arm_core.db's DatabaseError / DatabaseUnavailable, named after the
operation. Rows come back typed (arm_core.rows). Every state change happens in the
functions of db/functions.

The publisher's two operations take a `send` callback: the jobs are claimed, handed to
`send` (which publishes them to NATS and returns once the server confirmed them) and
marked within one transaction, so a job is never marked published unless `send`
returned; when `send` raises, the transaction rolls back and the exception propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import scalar_row
from psycopg.types.json import Jsonb
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from arm_core.db import (
    DatabaseConflict,
    DatabaseError,
    DatabaseUnavailable,
    PoolFigures,
    query,
    wrap_db_errors,
)
from arm_core.instruments import Instruments
from arm_core.rows import (
    AppliedEnvelope,
    BridgeInstance,
    DeadLetteredJob,
    FileListFilter,
    FileListItem,
    MovedJob,
    PacedJob,
    PaceRow,
    PublishedJob,
    RetryResult,
    SeriesPoint,
    StatusView,
    TaskRun,
    UnackedJob,
    typed_row,
)
from arm_core.statuses import PublishOutcome

log = logging.getLogger(__name__)

R = TypeVar("R")

# A call that a concurrent transaction rolled back (a deadlock, a serialization failure:
# DatabaseConflict) goes again this many times, after 50 ms, 100 ms, 150 ms. Every call
# of the store is one function call in one transaction, so nothing of the first try
# stays behind. Two multi-row writers can meet in opposite orders — a retry of many
# files and a batch of answers applied to some of the same files — and PostgreSQL then
# rolls one of them back; the second try finds the other committed.
CONFLICT_RETRIES = 3

# The publisher's callbacks: publish these jobs' requests and return once NATS has them
# (raise otherwise). The republishing one returns the jobs it sent.
SendPublished = Callable[[list[PublishedJob]], Awaitable[None]]
SendUnacked = Callable[[list[UnackedJob]], Awaitable[Sequence[UnackedJob]]]


@dataclasses.dataclass(frozen=True)
class Pacing:
    """The paced claim's settings (arm.publish_queued_jobs_v3): PACING, each pipeline's
    in-flight bounds, ACK_TIMEOUT_SECONDS and OUTBOX_MAX_REPUBLISH."""

    pacing: str
    tabular_min: int
    tabular_max: int
    image_min: int
    image_max: int
    ack_timeout: float
    max_republish: int


class Answer(Protocol):
    """An ack or a result as apply_envelopes_v2 takes it (arm_core.bridge.envelope's
    Envelope): row_json is one element of its JSON array."""

    @property
    def row_json(self) -> str: ...


def publish_params(
    *,
    limit: int,
    tabular_timeout: float,
    image_timeout: float,
    tabular_subject: str,
    image_subject: str,
    max_bytes: int,
    pacing: Pacing | None = None,
) -> dict[str, Any]:
    """The parameters of the publisher's claim (publish_paced_jobs with `pacing`,
    publish_queued_jobs without), as Store.publish_queued_jobs, tests and the benchmark
    send it."""
    params: dict[str, Any] = {
        "limit": limit,
        "tabular_timeout": tabular_timeout,
        "image_timeout": image_timeout,
        "tabular_subject": tabular_subject,
        "image_subject": image_subject,
        "max_bytes": max_bytes,
    }
    return params if pacing is None else params | dataclasses.asdict(pacing)


def file_list_params(
    limit: int, where: FileListFilter, after: tuple[dt.datetime, uuid.UUID] | None = None
) -> dict[str, Any]:
    """The parameters of the list_files query (`where` empty: every file), as
    Store.list_files, tests and the benchmark send them."""
    return {
        "limit": limit,
        "after_created_at": after[0] if after else None,
        "after_id": after[1] if after else None,
        "statuses": [s.value for s in where.statuses] or None,
        "job_statuses": [s.value for s in where.job_statuses] or None,
        "consolidation_id": where.consolidation_id,
        "file_types": [t.value for t in where.file_types] or None,
        "q": where.q,
        "updated_after": where.updated_after,
        "updated_before": where.updated_before,
    }


class Store:
    """Every runtime operation on the database, on `pool` (the process's only one).
    `instruments` are the process's: the outage and the exhausted waits are reported
    there, and the bridge built on this store counts there."""

    def __init__(
        self, pool: AsyncConnectionPool[Any], instruments: Instruments | None = None
    ) -> None:
        self.pool = pool
        self.instruments = instruments or Instruments()
        self._in_use = 0  # connections taken by _connection and not given back

    @property
    def pool_figures(self) -> PoolFigures:
        """The pool now (the gauges of /metrics), from psycopg_pool's get_stats() and
        this store's count of the connections in use."""
        stats = self.pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        return PoolFigures(
            max_size=self.pool.max_size,
            in_use=self._in_use,
            idle=idle,
            connecting=max(0, size - idle - self._in_use),
            waiting=stats.get("requests_waiting", 0),
        )

    # How a query is sent -----------------------------------------------------------------

    async def _fetch(
        self,
        conn: AsyncConnection[Any],
        name: str,
        params: dict[str, Any] | None = None,
        row: type[Any] | None = None,
        json_as_text: bool = False,
    ) -> Any:
        """The query's `row`s, or its one value when `row` is None."""
        cur = conn.cursor(row_factory=scalar_row if row is None else typed_row(row))
        if json_as_text:  # a request goes out as PostgreSQL wrote it: no parse and re-dump
            cur.adapters.register_loader("jsonb", TextLoader)
        await cur.execute(query(name), params)
        return await (cur.fetchone() if row is None else cur.fetchall())

    @contextlib.asynccontextmanager
    async def _connection(
        self, action: str, pool_timeout: float | None = None
    ) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection of the pool, for `action`. One whose server refused a write as
        read-only (a standby, or a primary being demoted, at a failover) is closed, so the
        pool replaces it with one to the writable server instead of handing it out again.

        When none comes within `pool_timeout` (DATABASE_POOL_TIMEOUT_SECONDS by default)
        while every connection of the pool is in use, DatabasePoolExhausted (logged and
        counted by the instruments' PoolExhaustion); otherwise the pool could not connect,
        and its PoolTimeout goes on to wrap_db_errors, which reports the outage."""
        acquired = False
        try:
            async with self.pool.connection(timeout=pool_timeout) as conn:
                acquired = True
                self._in_use += 1
                self.instruments.pool_exhaustion.relieved()
                try:
                    yield conn
                except psycopg.errors.ReadOnlySqlTransaction:
                    await conn.close()
                    raise
                finally:
                    self._in_use -= 1
        except PoolTimeout as exc:
            figures = self.pool_figures
            if acquired or not figures.full:
                raise
            waited = self.pool.timeout if pool_timeout is None else pool_timeout
            raise self.instruments.pool_exhaustion.exhausted(action, waited, figures) from exc

    async def _pooled(
        self,
        name: str,
        params: dict[str, Any] | None = None,
        row: type[Any] | None = None,
        pool_timeout: float | None = None,
    ) -> Any:
        """One statement in a transaction of its own (_fetch), sent again after a short
        pause when a concurrent transaction rolled it back, up to CONFLICT_RETRIES times;
        the last DatabaseConflict goes to the caller."""
        tries = 0
        while True:
            try:
                with wrap_db_errors(name, self.instruments.outage):
                    async with self._connection(name, pool_timeout) as conn:
                        return await self._fetch(conn, name, params, row)
            except DatabaseConflict as exc:
                if tries == CONFLICT_RETRIES:
                    raise
                tries += 1
                log.info(
                    "%s: trying again (%d of %d): %s",
                    name,
                    tries,
                    CONFLICT_RETRIES,
                    exc,
                    extra={"action": "db_conflict", "count": tries},
                )
                await asyncio.sleep(0.05 * tries)

    async def _bounded(
        self, name: str, params: dict[str, Any] | None, row: type[Any] | None, within: float
    ) -> Any:
        """_fetch within `within` seconds, the wait for a connection included (past it, as
        for any wait: DatabasePoolExhausted or DatabaseUnavailable); a statement still
        running at the deadline is cancelled (psycopg sends the server a cancel request)
        and DatabaseUnavailable raised."""
        deadline = asyncio.get_running_loop().time() + within
        with wrap_db_errors(name, self.instruments.outage):
            async with self._connection(name, within) as conn:
                try:
                    async with asyncio.timeout_at(deadline):
                        return await self._fetch(conn, name, params, row)
                except TimeoutError as exc:
                    raise DatabaseUnavailable(f"{name}: no answer within {within:g} s") from exc

    # The publisher's: claim, send, mark, in one transaction -----------------------------

    async def publish_queued_jobs(
        self, *, send: SendPublished, pacing: Pacing | None = None, **claim: Any
    ) -> list[PublishedJob]:
        """Claims up to `limit` queued jobs, oldest first, marking them published — or
        dlq, when the request exceeds `max_bytes` — in one statement (`claim`: the other
        keywords of publish_params); hands the published ones to `send` and commits once
        it returned. Returns every claimed job. When `send` raises, nothing changed
        (rolled back) and its exception propagates. With `pacing`, each pipeline gives at
        most what its in-flight limit leaves, round robin over its consolidations
        (arm.publish_queued_jobs_v3)."""
        params = publish_params(**claim, pacing=pacing)
        name = "publish_queued_jobs" if pacing is None else "publish_paced_jobs"
        row = PublishedJob if pacing is None else PacedJob
        with wrap_db_errors("publish", self.instruments.outage):  # the commit's errors too
            async with self._connection("publish") as conn, conn.transaction():
                claimed: list[PublishedJob] = await self._fetch(
                    conn, name, params, row, json_as_text=True
                )
                sent = [c for c in claimed if c.outcome is PublishOutcome.PUBLISHED]
                if sent:
                    await send(sent)
        return claimed

    async def republish_unacked_jobs(
        self,
        *,
        limit: int,
        ack_timeout: float,
        max_republish: int,
        max_bytes: int,
        send: SendUnacked,
    ) -> tuple[list[UnackedJob], list[UnackedJob]]:
        """Locks up to `limit` published jobs unacked for `ack_timeout` seconds and
        republished fewer than `max_republish` times, oldest first; hands those that fit
        `max_bytes` to `send` and counts a republish of each job it returns; dead-letters
        the others (REQUEST_TOO_LARGE: the server's max_payload was lowered) in the same
        transaction, committed once `send` returned. Returns (what was sent, what was
        dead-lettered). When `send` raises, nothing changed."""
        params = {"limit": limit, "ack_timeout": ack_timeout, "max_republish": max_republish}
        with wrap_db_errors("republish", self.instruments.outage):
            async with self._connection("republish") as conn, conn.transaction():
                claimed: list[UnackedJob] = await self._fetch(
                    conn, "claim_unacked_jobs", params, UnackedJob, json_as_text=True
                )
                fits = [c for c in claimed if c.bytes <= max_bytes]
                too_large = [c for c in claimed if c.bytes > max_bytes]
                sent = list(await send(fits)) if fits else []
                if sent:
                    job_ids = [c.job_id for c in sent]
                    await self._fetch(conn, "mark_republished", {"job_ids": job_ids})
                if too_large:
                    dead = {
                        "job_ids": [c.job_id for c in too_large],
                        "error_codes": ["REQUEST_TOO_LARGE"] * len(too_large),
                        "error_messages": [
                            f"request of {c.bytes} bytes > the server's max_payload "
                            f"{max_bytes} (lowered since its first publish)"
                            for c in too_large
                        ],
                    }
                    moved = await self._fetch(conn, "dead_letter_unrepublishable", dead, MovedJob)
                    ids = {m.job_id for m in moved}
                    too_large = [c for c in too_large if c.job_id in ids]
        return sent, too_large

    # One statement each ----------------------------------------------------------------

    async def dead_letter_unacked(
        self, *, ack_timeout: float, max_republish: int
    ) -> list[DeadLetteredJob]:
        """Moves published jobs unacked for `ack_timeout` seconds after `max_republish`
        republishes to dlq (NO_ACK)."""
        params = {"ack_timeout": ack_timeout, "max_republish": max_republish}
        return await self._pooled("dead_letter_unacked", params, DeadLetteredJob)

    async def answers(self, pool_timeout: float | None = None) -> None:
        """Returns once the database answered one trivial statement."""
        await self._pooled("answers", pool_timeout=pool_timeout)

    async def outbox_ready_age(self, pool_timeout: float | None = None) -> float:
        """Seconds the oldest queued job that pacing does not hold back has waited (0 when
        there is none: arm.outbox_ready_age coalesces)."""
        return float(await self._pooled("outbox_ready_age", pool_timeout=pool_timeout))

    async def apply_envelopes(self, answers: Sequence[Answer]) -> list[AppliedEnvelope]:
        """Applies a batch of acks and results in one statement (one transaction), in
        order; returns one outcome per answer, in the batch's order, each applied one with
        the wait it ended."""
        # The rows are JSON text already: joined, not parsed and dumped again.
        payload = "[" + ",".join(a.row_json for a in answers) + "]"
        rows = await self._pooled("apply_envelopes", {"envelopes": payload}, AppliedEnvelope)
        if len(rows) != len(answers):
            raise DatabaseError(f"apply_envelopes_v2 returned {len(rows)} rows for {len(answers)}")
        return rows

    async def compact_counts(self) -> int:
        """Folds the per-status count deltas into the counts; returns how many."""
        return int(await self._pooled("compact_counts"))

    # `within` bounds the wait for a connection and the statement of each of these.

    async def status_view(self, ack_timeout: float, within: float) -> StatusView:
        """GET /api/v1/status's figures."""
        [row] = await self._bounded("status_view", {"ack_timeout": ack_timeout}, StatusView, within)
        return row

    async def pace_view(self, within: float) -> list[PaceRow]:
        """Each pipeline's pacing (arm.pace_view)."""
        return await self._bounded("pace_view", {}, PaceRow, within)

    async def status_series(self, minutes: int, within: float) -> list[SeriesPoint]:
        """The console's charts: the samples of the last `minutes`, oldest first."""
        return await self._bounded("status_series", {"minutes": minutes}, SeriesPoint, within)

    async def bridge_instances(self, within: float) -> list[BridgeInstance]:
        """Every bridge seen in the last day, the most recently seen first."""
        return await self._bounded("bridge_instances", None, BridgeInstance, within)

    async def forget_bridge(self, name: str, within: float) -> bool:
        """Deletes the bridge's row (a clean stop)."""
        return bool(await self._bounded("forget_bridge", {"name": name}, None, within))

    async def pace_unheard(self, pipeline: str, retry_seconds: float) -> None:
        """Nobody listens on `pipeline`'s request subject: hold it, probe again in
        `retry_seconds` (arm.pace_unheard)."""
        await self._pooled("pace_unheard", {"pipeline": pipeline, "retry_seconds": retry_seconds})

    async def record_waits(self, waits: dict[str, list[int]]) -> None:
        """Stores the waits a bridge observed, per phase and bucket, in one transaction."""
        with wrap_db_errors("record_waits", self.instruments.outage):
            async with self._connection("record_waits") as conn, conn.transaction():
                for phase, counts in waits.items():
                    await self._fetch(conn, "record_waits", {"phase": phase, "counts": counts})

    async def run_due_tasks(self) -> list[TaskRun]:
        """Runs every periodic task that is due (each once, whoever else ticks)."""
        return await self._pooled("run_due_tasks", None, TaskRun)

    async def set_sweep_interval(self, seconds: float) -> None:
        """Sets the period of the sweep_timeouts task (not whether a DBA enabled it)."""
        await self._pooled("set_sweep_interval", {"seconds": seconds})

    async def set_setting(self, name: str, value: str) -> None:
        """Writes one of arm.setting's values."""
        await self._pooled("set_setting", {"name": name, "value": value})

    async def record_bridge(self, bridge: BridgeInstance) -> None:
        """Writes the bridge's row: it is alive, in this state (its seen_seconds_ago is
        the database's clock, not the caller's)."""
        params = dataclasses.asdict(bridge) | {"loops": Jsonb(bridge.loops)}
        await self._pooled("record_bridge", params)

    async def retry_file(
        self,
        file_id: uuid.UUID,
        actor: str,
        expected_job_id: uuid.UUID | None = None,
        *,
        actor_level: str | None = None,
    ) -> RetryResult:
        """A new attempt of a failed file on behalf of `actor` (who retried with
        `actor_level`, for the audit) — when its current job is still `expected_job_id`
        (None: whichever) — or why not."""
        params = {
            "file_id": file_id,
            "actor": actor,
            "expected_job_id": expected_job_id,
            "actor_level": actor_level,
        }
        [row] = await self._pooled("retry_file", params, RetryResult)
        return row

    async def retry_files(
        self,
        file_ids: Sequence[uuid.UUID],
        actor: str,
        expected_job_ids: Sequence[uuid.UUID | None] | None = None,
        *,
        actor_level: str | None = None,
    ) -> list[RetryResult]:
        """retry_file for many files in one transaction: one result per distinct file;
        expected_job_ids[i], when given, is the job the caller saw for file_ids[i]."""
        expected = list(expected_job_ids) if expected_job_ids is not None else None
        params = {
            "file_ids": list(file_ids),
            "actor": actor,
            "expected_job_ids": expected,
            "actor_level": actor_level,
        }
        return await self._pooled("retry_files", params, RetryResult)

    async def get_file(self, file_id: uuid.UUID) -> dict[str, Any] | None:
        """The file, its current job and every attempt as one JSON document; None when
        there is no such file."""
        return await self._pooled("get_file", {"file_id": file_id})

    async def list_files(
        self,
        limit: int,
        where: FileListFilter,
        after: tuple[dt.datetime, uuid.UUID] | None = None,
    ) -> list[FileListItem]:
        """Up to `limit` files matching `where`, newest first (created_at, then id),
        after the keyset `after` (the last file of the previous page)."""
        return await self._pooled("list_files", file_list_params(limit, where, after), FileListItem)


class SyncStore:
    """The queries `arm-core migrate` sends, on its connection and in its transaction
    (whose errors it wraps)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def set_sweep_interval(self, seconds: float) -> None:
        """Store.set_sweep_interval's."""
        self.conn.execute(query("set_sweep_interval"), {"seconds": seconds})

    def set_setting(self, name: str, value: str) -> None:
        """Store.set_setting's."""
        self.conn.execute(query("set_setting"), {"name": name, "value": value})
