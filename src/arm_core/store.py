"""The typed store: every named query of queries.sql, its parameters and its rows.

One method per query, named as the query and typed with what its rows are
(tests/integration/test_store.py keeps the two lists equal, and each row class equal to
the columns a real database returns). The SQL stays in arm_core/queries.sql and every
state change in the functions of db/functions; this module only says what goes in and
what comes out: frozen dataclasses with enums (arm_core.statuses), built by a row
factory that checks the query's columns against the dataclass's fields on every
execute.

Two kinds of method, as the callers manage their transactions:

* most run one statement on a connection of the pool (autocommit) and translate driver
  errors (arm_core.db.wrap_db_errors, the action named after the query);
* the publisher's (publish_queued_jobs_v2, claim_unacked_jobs, mark_republished) take
  the caller's connection and run in its open transaction (:meth:`Store.transaction`):
  the caller publishes to NATS between the claim and the commit, and wraps the errors of
  the whole transaction, commit included.

`arm-core migrate` is synchronous: :class:`SyncStore` has the two settings queries it
sends, on its connection.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import typing
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import BaseRowFactory, RowMaker, no_result, scalar_row
from psycopg.types.json import Jsonb
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool

from arm_core.db import DatabaseError, DatabaseUnavailable, query, wrap_db_errors
from arm_core.statuses import (
    ApplyOutcome,
    FileStatus,
    FileType,
    JobStatus,
    PublishOutcome,
    RetryOutcome,
    RetryReason,
)

R = TypeVar("R")

# A JSON object as the database returns it (jsonb, loaded).
JsonObject = dict[str, Any]


# --- rows ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadLetteredJob:
    """dead_letter_unacked: a published job moved to dlq (NO_ACK) after its republishes."""

    job_id: uuid.UUID
    attempt: int
    file_id: uuid.UUID
    republish_count: int


@dataclass(frozen=True, slots=True)
class UnackedJob:
    """claim_unacked_jobs: an overdue, unacked job locked for republishing with the same
    subject, Nats-Msg-Id and request."""

    job_id: uuid.UUID
    attempt: int
    subject: str
    msg_id: str
    republish_count: int
    request: str  # JSON text, byte for byte what the first publish sent
    bytes: int  # what the server counts against max_payload (arm.nats_message_bytes)


@dataclass(frozen=True, slots=True)
class PublishedJob:
    """publish_queued_jobs_v2: a claimed job, marked published (its request is to be
    sent, the transaction committed once NATS confirmed it) or dead-lettered at once
    because the request exceeds the server's max_payload; for a published job the seconds
    it waited queued (requested_at → the claim)."""

    job_id: uuid.UUID
    attempt: int
    file_id: uuid.UUID
    outcome: PublishOutcome
    subject: str
    msg_id: str
    request: str | None  # JSON text to send as it is; None when dead-lettered
    error_message: str | None  # why it was dead-lettered
    queued_seconds: float | None  # None when dead-lettered


@dataclass(frozen=True, slots=True)
class AppliedEnvelope:
    """apply_envelopes_v2: one element's outcome (`ord` is its 1-based place in the
    batch), the job's attempt and status after it, and for an applied element the wait it
    ended (an ack: published → processing; a result: processing → final; None else)."""

    ord: int
    outcome: ApplyOutcome
    attempt: int | None
    status: JobStatus | None
    wait_seconds: float | None


@dataclass(frozen=True, slots=True)
class StatusCount:
    """job_counts: the number of jobs in one status."""

    status: JobStatus
    n: int


@dataclass(frozen=True, slots=True)
class StatusView:
    """status_view: GET /api/v1/status's figures (jobs and files as {status: n})."""

    jobs: dict[str, int]
    files: dict[str, int]
    oldest_queued_age_seconds: float
    unacked_overdue: int
    past_deadline_unswept: int
    last_sweep_at: dt.datetime | None
    last_sweep_result: str | None
    last_sweep_error: str | None


@dataclass(frozen=True, slots=True)
class TaskRun:
    """run_due_tasks: a periodic task that ran, with its result or its error."""

    task: str
    result: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class RetryResult:
    """retry_file, retry_files: one file's outcome. For `retried` the new job and its
    attempt; for `not_retryable` the reason and the current job that prevents it."""

    file_id: uuid.UUID
    outcome: RetryOutcome
    reason: RetryReason | None
    job_id: uuid.UUID | None
    attempt: int | None
    previous_job_id: uuid.UUID | None
    previous_status: JobStatus | None
    previous_attempt: int | None
    max_attempts: int | None


@dataclass(frozen=True, slots=True)
class FileListItem:
    """list_files: one file of a page, its current job (all None when it has none) and
    whether it can be retried (arm.is_retryable: the rule of retry_file)."""

    id: uuid.UUID
    consolidation_id: uuid.UUID | None
    original_name: str
    file_type: FileType
    status: FileStatus
    s3_bucket: str
    s3_key: str
    created_at: dt.datetime
    updated_at: dt.datetime
    job_id: uuid.UUID | None
    job_status: JobStatus | None
    attempt: int | None
    max_attempts: int | None
    error_code: str | None
    retryable: bool


@dataclass(frozen=True, slots=True)
class FileListFilter:
    """list_files' filters; None (or an empty tuple) is any."""

    statuses: tuple[FileStatus, ...] = ()
    job_statuses: tuple[JobStatus, ...] = ()
    consolidation_id: uuid.UUID | None = None
    file_types: tuple[FileType, ...] = ()
    q: str | None = None
    updated_after: dt.datetime | None = None
    updated_before: dt.datetime | None = None


def _enum_of(hint: Any) -> type[Enum] | None:
    """The enum a field holds (`X` or `X | None`), or None."""
    for candidate in typing.get_args(hint) or (hint,):
        if isinstance(candidate, type) and issubclass(candidate, Enum):
            return candidate
    return None


class _Members(dict[Any, Any]):
    """An enum's members by value, and None for NULL: a plain dict lookup per value,
    three times faster than calling the enum (the inbox builds up to 500 rows a batch)."""

    def __init__(self, enum: type[Enum]) -> None:
        super().__init__({member.value: member for member in enum})
        self[None] = None
        self.enum = enum

    def __missing__(self, value: Any) -> Any:
        raise ValueError(f"the database returned {value!r}, which is no {self.enum.__name__}")


_FIELDS: dict[type[Any], tuple[tuple[str, ...], tuple[tuple[int, _Members], ...]]] = {}


def _fields(cls: type[Any]) -> tuple[tuple[str, ...], tuple[tuple[int, _Members], ...]]:
    """A row class's field names, and the place and members of each enum field (worked
    out once per class)."""
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        names = tuple(f.name for f in fields(cls))
        enums = [(i, _enum_of(hints[name])) for i, name in enumerate(names)]
        _FIELDS[cls] = names, tuple((i, _Members(e)) for i, e in enums if e is not None)
    return _FIELDS[cls]


def typed_row(cls: type[R]) -> BaseRowFactory[R]:
    """A row factory building `cls` (a dataclass) from each row, text converted to the
    enums its fields declare. The query's columns must be the fields, in their order:
    checked once per execute, so a query and its row class cannot drift apart silently."""
    names, enums = _fields(cls)

    def factory(cursor: Any) -> RowMaker[R]:
        if cursor.description is None:
            return no_result
        columns = tuple(c.name for c in cursor.description)
        if columns != names:
            raise TypeError(f"{cls.__name__} has the fields {names}; the query returns {columns}")
        if not enums:
            return lambda values: cls(*values)

        def make(values: Sequence[Any]) -> R:
            converted = list(values)
            for i, members in enums:
                converted[i] = members[converted[i]]
            return cls(*converted)

        return make

    return factory


# --- parameters -----------------------------------------------------------------------


class Answer(Protocol):
    """An ack or a result as apply_envelopes_v2 takes it: arm_core.bridge.envelope's
    Envelope. row() has the keys job_id, file_id, msg_id, status, service_name,
    service_version, result_bucket, result_key, result_schema_version, error_code,
    error_message, metrics."""

    def row(self) -> dict[str, Any]: ...


def _dumps(value: Any) -> str:
    # allow_nan=False: the inbox has replaced every non-finite number already (envelope
    # storable()); should one slip through, this raises here instead of in PostgreSQL.
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# --- the store ------------------------------------------------------------------------


class Store:
    """Every query the runtime sends, on `pool` (or, for the publisher's, on the caller's
    connection in its transaction)."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection of the pool in one transaction, committed when the block ends
        and rolled back when it raises: where the publisher's methods run."""
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    async def _rows(
        self,
        conn: AsyncConnection[Any],
        name: str,
        row: type[R],
        params: dict[str, Any] | None = None,
        json_as_text: bool = False,
    ) -> list[R]:
        cur = conn.cursor(row_factory=typed_row(row))
        if json_as_text:  # a request goes out as PostgreSQL wrote it: no parse and re-dump
            cur.adapters.register_loader("jsonb", TextLoader)
        await cur.execute(query(name), params)
        return await cur.fetchall()

    async def _scalar(
        self, conn: AsyncConnection[Any], name: str, params: dict[str, Any] | None = None
    ) -> Any:
        cur = conn.cursor(row_factory=scalar_row)
        await cur.execute(query(name), params)
        return await cur.fetchone()

    async def _pooled_rows(
        self, name: str, row: type[R], params: dict[str, Any] | None = None
    ) -> list[R]:
        with wrap_db_errors(name):
            async with self.pool.connection() as conn:
                return await self._rows(conn, name, row, params)

    async def _pooled_scalar(
        self, name: str, params: dict[str, Any] | None = None, pool_timeout: float | None = None
    ) -> Any:
        with wrap_db_errors(name):
            async with self.pool.connection(timeout=pool_timeout) as conn:
                return await self._scalar(conn, name, params)

    async def _bounded_rows(
        self, name: str, row: type[R], params: dict[str, Any] | None, within: float
    ) -> list[R]:
        """_pooled_rows within `within` seconds, the wait for a connection included; past
        it the statement is cancelled (psycopg sends the server a cancel request) and
        DatabaseUnavailable raised."""
        try:
            async with asyncio.timeout(within):
                with wrap_db_errors(name):
                    async with self.pool.connection(timeout=within) as conn:
                        return await self._rows(conn, name, row, params)
        except TimeoutError as exc:
            raise DatabaseUnavailable(f"{name}: no answer within {within:g} s") from exc

    # The publisher's, in the caller's transaction --------------------------------------

    async def publish_queued_jobs_v2(
        self,
        conn: AsyncConnection[Any],
        *,
        limit: int,
        tabular_timeout: float,
        image_timeout: float,
        tabular_subject: str,
        image_subject: str,
        max_bytes: int,
    ) -> list[PublishedJob]:
        """Claims up to `limit` queued jobs, oldest first, and in the same statement marks
        them published, or dlq when the request exceeds `max_bytes`. Commit only once
        NATS confirmed every published request; roll back otherwise."""
        params = {
            "limit": limit,
            "tabular_timeout": tabular_timeout,
            "image_timeout": image_timeout,
            "tabular_subject": tabular_subject,
            "image_subject": image_subject,
            "max_bytes": max_bytes,
        }
        return await self._rows(
            conn, "publish_queued_jobs_v2", PublishedJob, params, json_as_text=True
        )

    async def claim_unacked_jobs(
        self, conn: AsyncConnection[Any], *, limit: int, ack_timeout: float, max_republish: int
    ) -> list[UnackedJob]:
        """Locks up to `limit` published jobs unacked for `ack_timeout` seconds and
        republished fewer than `max_republish` times, oldest first."""
        params = {"limit": limit, "ack_timeout": ack_timeout, "max_republish": max_republish}
        return await self._rows(conn, "claim_unacked_jobs", UnackedJob, params, json_as_text=True)

    async def mark_republished(
        self, conn: AsyncConnection[Any], job_ids: Sequence[uuid.UUID]
    ) -> int:
        """Counts a republish of jobs whose request reached NATS again; returns how many
        (still published) changed."""
        marked: int = await self._scalar(conn, "mark_republished", {"job_ids": list(job_ids)})
        return marked

    # On the pool -----------------------------------------------------------------------

    async def dead_letter_unacked(
        self, *, ack_timeout: float, max_republish: int
    ) -> list[DeadLetteredJob]:
        """Moves published jobs unacked for `ack_timeout` seconds after `max_republish`
        republishes to dlq (NO_ACK)."""
        params = {"ack_timeout": ack_timeout, "max_republish": max_republish}
        return await self._pooled_rows("dead_letter_unacked", DeadLetteredJob, params)

    async def outbox_oldest_queued_age(self, pool_timeout: float | None = None) -> float:
        """Seconds the oldest queued job has waited (0 when none is queued);
        `pool_timeout` bounds the wait for a connection of the pool."""
        age = await self._pooled_scalar("outbox_oldest_queued_age", pool_timeout=pool_timeout)
        return float(age) if age is not None else 0.0

    async def apply_envelopes_v2(self, answers: Sequence[Answer]) -> list[AppliedEnvelope]:
        """Applies a batch of acks and results in one statement (one transaction), in
        order; returns one outcome per answer, in the batch's order, each applied one with
        the wait it ended."""
        payload = Jsonb([a.row() for a in answers], dumps=_dumps)
        rows = await self._pooled_rows(
            "apply_envelopes_v2", AppliedEnvelope, {"envelopes": payload}
        )
        if len(rows) != len(answers):
            raise DatabaseError(f"apply_envelopes_v2 returned {len(rows)} rows for {len(answers)}")
        return rows

    async def job_counts(self, within: float) -> list[StatusCount]:
        """Jobs per status (every status), costing what changed since the last compaction,
        not the history; `within` bounds the wait for a connection and the statement."""
        return await self._bounded_rows("job_counts", StatusCount, None, within)

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

    async def retry_file(self, file_id: uuid.UUID, actor: str) -> RetryResult:
        """A new attempt of a failed file on behalf of `actor`, or why not."""
        params = {"file_id": file_id, "actor": actor}
        [row] = await self._pooled_rows("retry_file", RetryResult, params)
        return row

    async def retry_files(self, file_ids: Sequence[uuid.UUID], actor: str) -> list[RetryResult]:
        """retry_file for many files in one transaction: one result per distinct file."""
        params = {"file_ids": list(file_ids), "actor": actor}
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
        params = {
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
