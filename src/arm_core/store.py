"""The store: the one object through which a process sends its queries.

A process makes one :class:`Store` on its connection pool and hands it to every service
and handler (src/arm_core/runtime.py); nothing else holds the pool. Each public method is
one runtime operation: it sends the named queries of src/arm_core/queries.sql it needs
(tests/integration/test_store.py: each query is sent by exactly one method, and every
method is called by the runtime or the admin code), owns its transaction, and turns
driver errors into arm_core.db's DatabaseError / DatabaseUnavailable, named after the
operation. How a query is sent is its base's (arm_core.pooled): a wait for a connection
that runs out is DatabasePoolExhausted when every connection of the pool is in use (the
store counts those it holds: nothing else takes the pool's), DatabaseUnavailable (an
outage) when the pool could not connect. Rows come back typed (arm_core.rows). Every
state change happens in the functions of db/functions; this module only says what goes
in and what comes out.

The publisher's two operations take a `send` callback: the jobs are claimed, handed to
`send` (which publishes them to NATS and returns once the server confirmed them) and
marked within one transaction, so a job is never marked published unless `send`
returned; when `send` raises, the transaction rolls back and the exception propagates.

`arm-core migrate` is synchronous: :class:`SyncStore` has the two settings queries it
sends, on its connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from arm_core.db import DatabaseError, query, wrap_db_errors
from arm_core.pooled import Pooled
from arm_core.rows import (
    AppliedEnvelope,
    BridgeInstance,
    DeadLetteredJob,
    FileListFilter,
    FileListItem,
    JsonObject,
    MovedJob,
    PacedJob,
    PaceRow,
    PublishedJob,
    RetryResult,
    SeriesPoint,
    StatusView,
    TaskRun,
    UnackedJob,
)
from arm_core.statuses import PublishOutcome

# The publisher's callbacks: publish these jobs' requests and return once NATS has them
# (raise otherwise). The republishing one returns the jobs it sent.
SendPublished = Callable[[list[PublishedJob]], Awaitable[None]]


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


SendUnacked = Callable[[list[UnackedJob]], Awaitable[Sequence[UnackedJob]]]


# --- parameters -----------------------------------------------------------------------


class Answer(Protocol):
    """An ack or a result as apply_envelopes_v2 takes it: arm_core.bridge.envelope's
    Envelope. row_json is one element of its JSON array (the keys: bridge/envelope.py's
    _row_json, db/functions/30_inbox.sql)."""

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
    """The parameters of the publisher's claim as Store.publish_queued_jobs sends it
    (the publish_paced_jobs query with `pacing`, publish_queued_jobs without); tests and
    the benchmark send the claim with these."""
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
    Store.list_files sends them; tests and the benchmark send the query with these."""
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


# --- the store ------------------------------------------------------------------------


class Store(Pooled):
    """Every runtime operation on the database, on `pool` (the process's only one).
    `instruments` are the process's (arm_core.instruments): the outage and the
    exhausted waits are reported there, and the bridge built on this store counts there.
    How a query is sent (a connection, typed rows, a bound, errors translated) is
    arm_core.pooled's."""

    # The publisher's: claim, send, mark, in one transaction -----------------------------

    async def publish_queued_jobs(
        self,
        *,
        limit: int,
        tabular_timeout: float,
        image_timeout: float,
        tabular_subject: str,
        image_subject: str,
        max_bytes: int,
        send: SendPublished,
        pacing: Pacing | None = None,
    ) -> list[PublishedJob]:
        """Claims up to `limit` queued jobs, oldest first, marking them published — or
        dlq, when the request exceeds `max_bytes` — in one statement; hands the published
        ones to `send` and commits once it returned. Returns every claimed job. When
        `send` raises, nothing changed (rolled back) and its exception propagates.
        With `pacing`, each pipeline gives at most what its in-flight limit leaves, round
        robin over its consolidations (arm.publish_queued_jobs_v3)."""
        params = publish_params(
            limit=limit,
            tabular_timeout=tabular_timeout,
            image_timeout=image_timeout,
            tabular_subject=tabular_subject,
            image_subject=image_subject,
            max_bytes=max_bytes,
            pacing=pacing,
        )
        name = "publish_queued_jobs"
        row: type[PublishedJob] = PublishedJob
        if pacing is not None:
            name, row = "publish_paced_jobs", PacedJob
        with wrap_db_errors("publish", self.instruments.outage):  # the commit's errors too
            async with self._connection("publish") as conn, conn.transaction():
                claimed = await self._rows(conn, name, row, params, json_as_text=True)
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
                claimed = await self._rows(
                    conn, "claim_unacked_jobs", UnackedJob, params, json_as_text=True
                )
                fits = [c for c in claimed if c.bytes <= max_bytes]
                too_large = [c for c in claimed if c.bytes > max_bytes]
                sent = list(await send(fits)) if fits else []
                if sent:
                    job_ids = [c.job_id for c in sent]
                    await self._scalar(conn, "mark_republished", {"job_ids": job_ids})
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
                    moved = await self._rows(conn, "dead_letter_unrepublishable", MovedJob, dead)
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
        return await self._pooled_rows("dead_letter_unacked", DeadLetteredJob, params)

    async def answers(self, pool_timeout: float | None = None) -> None:
        """Returns once the database answered one trivial statement; raises as every
        call does when it does not (`pool_timeout` bounds the wait for a connection)."""
        await self._pooled_scalar("answers", pool_timeout=pool_timeout)

    async def outbox_ready_age(self, pool_timeout: float | None = None) -> float:
        """Seconds the oldest queued job that pacing does not hold back has waited (0 when
        there is none; arm.outbox_ready_age); `pool_timeout` bounds the wait for a
        connection of the pool."""
        age = await self._pooled_scalar("outbox_ready_age", pool_timeout=pool_timeout)
        return float(age) if age is not None else 0.0

    async def apply_envelopes(self, answers: Sequence[Answer]) -> list[AppliedEnvelope]:
        """Applies a batch of acks and results in one statement (one transaction), in
        order; returns one outcome per answer, in the batch's order, each applied one with
        the wait it ended."""
        # The rows are JSON text already: joined, not parsed and dumped again.
        payload = "[" + ",".join(a.row_json for a in answers) + "]"
        rows = await self._pooled_rows("apply_envelopes", AppliedEnvelope, {"envelopes": payload})
        if len(rows) != len(answers):
            raise DatabaseError(f"apply_envelopes_v2 returned {len(rows)} rows for {len(answers)}")
        return rows

    async def compact_counts(self) -> int:
        """Folds the per-status count deltas into the counts; returns how many it folded."""
        return int(await self._pooled_scalar("compact_counts"))

    async def status_view(self, ack_timeout: float, within: float) -> StatusView:
        """GET /api/v1/status's figures; `within` bounds the wait for a connection and
        the statement."""
        [row] = await self._bounded_rows(
            "status_view", StatusView, {"ack_timeout": ack_timeout}, within
        )
        return row

    async def pace_unheard(self, pipeline: str, retry_seconds: float) -> None:
        """Nobody listens on `pipeline`'s request subject: hold it, probe again in
        `retry_seconds` (arm.pace_unheard)."""
        await self._pooled_scalar(
            "pace_unheard", {"pipeline": pipeline, "retry_seconds": retry_seconds}
        )

    async def pace_view(self, within: float) -> list[PaceRow]:
        """Each pipeline's pacing (arm.pace_view); `within` bounds the wait for a
        connection and the statement."""
        return await self._bounded_rows("pace_view", PaceRow, {}, within)

    async def status_series(self, minutes: int, within: float) -> list[SeriesPoint]:
        """The console's charts: the samples of the last `minutes`, oldest first; `within`
        bounds the wait for a connection and the statement."""
        return await self._bounded_rows("status_series", SeriesPoint, {"minutes": minutes}, within)

    async def record_waits(self, waits: dict[str, list[int]]) -> None:
        """Stores the waits a bridge observed, per phase and bucket, in one transaction."""
        with wrap_db_errors("record_waits", self.instruments.outage):
            async with self._connection("record_waits") as conn, conn.transaction():
                for phase, counts in waits.items():
                    await self._scalar(conn, "record_waits", {"phase": phase, "counts": counts})

    async def run_due_tasks(self) -> list[TaskRun]:
        """Runs every periodic task that is due (each once, whoever else ticks)."""
        return await self._pooled_rows("run_due_tasks", TaskRun)

    async def set_sweep_interval(self, seconds: float) -> None:
        """Sets the period of the sweep_timeouts task (only that: whether it is enabled
        stays as a DBA set it)."""
        await self._pooled_scalar("set_sweep_interval", {"seconds": seconds})

    async def set_setting(self, name: str, value: str) -> None:
        """Writes one of arm.setting's values."""
        await self._pooled_scalar("set_setting", {"name": name, "value": value})

    async def record_bridge(self, bridge: BridgeInstance) -> None:
        """Writes the bridge's row: it is alive, in this state (its seen_seconds_ago is
        the database's clock, not the caller's)."""
        params = {
            "name": bridge.name,
            "version": bridge.version,
            "started_at": bridge.started_at,
            "nats": bridge.nats,
            "listener": bridge.listener,
            "loops": Jsonb(bridge.loops),
            "held": bridge.held,
        }
        await self._pooled_scalar("record_bridge", params)

    async def forget_bridge(self, name: str, within: float) -> bool:
        """Deletes the bridge's row (a clean stop), within `within` seconds."""
        forgotten = self._pooled_scalar("forget_bridge", {"name": name}, pool_timeout=within)
        return bool(await asyncio.wait_for(forgotten, within))

    async def bridge_instances(self, within: float) -> list[BridgeInstance]:
        """Every bridge seen in the last day, the most recently seen first."""
        return await self._bounded_rows("bridge_instances", BridgeInstance, None, within)

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
        [row] = await self._pooled_rows("retry_file", RetryResult, params)
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
        return await self._pooled_rows("retry_files", RetryResult, params)

    async def get_file(self, file_id: uuid.UUID) -> JsonObject | None:
        """The file, its current job and every attempt as one JSON document; None when
        there is no such file."""
        document: JsonObject | None = await self._pooled_scalar("get_file", {"file_id": file_id})
        return document

    async def list_files(
        self,
        limit: int,
        where: FileListFilter,
        after: tuple[dt.datetime, uuid.UUID] | None = None,
    ) -> list[FileListItem]:
        """Up to `limit` files matching `where`, newest first (created_at, then id),
        after the keyset `after` (the last file of the previous page)."""
        params = file_list_params(limit, where, after)
        return await self._pooled_rows("list_files", FileListItem, params)


class SyncStore:
    """The queries `arm-core migrate` sends, on its (synchronous) connection and in its
    transaction; it wraps the errors of the whole migration."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def _execute(self, name: str, params: dict[str, Any]) -> None:
        self.conn.execute(query(name), params)

    def set_sweep_interval(self, seconds: float) -> None:
        """Sets the period of the sweep_timeouts task (only that: whether it is enabled
        stays as a DBA set it)."""
        self._execute("set_sweep_interval", {"seconds": seconds})

    def set_setting(self, name: str, value: str) -> None:
        """Writes one of arm.setting's values."""
        self._execute("set_setting", {"name": name, "value": value})
