"""The rows the store returns: one frozen dataclass per kind of row, with enums
(arm_core.statuses) where the database returns a status, and :func:`typed_row`, the row
factory that builds them and checks, on every execute, that the query's columns are the
class's fields in their order (so a query and its row class cannot drift apart)."""

from __future__ import annotations

import datetime as dt
import functools
import typing
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, TypeVar

from psycopg.rows import BaseRowFactory, RowMaker, no_result

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


# --- rows ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MovedJob:
    """dead_letter_unrepublishable: a published job moved to dlq (REQUEST_TOO_LARGE)."""

    job_id: uuid.UUID
    attempt: int
    file_id: uuid.UUID


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
    """publish_queued_jobs_v2: a claimed job, marked published (its request to be sent)
    or dead-lettered because the request exceeds the server's max_payload."""

    job_id: uuid.UUID
    attempt: int
    file_id: uuid.UUID
    outcome: PublishOutcome
    subject: str
    msg_id: str
    request: str | None  # JSON text to send as it is; None when dead-lettered
    error_message: str | None  # why it was dead-lettered
    queued_seconds: float | None  # requested_at → the claim; None when dead-lettered


@dataclass(frozen=True, slots=True)
class PacedJob(PublishedJob):
    """publish_queued_jobs_v3: the same, and whether it is a probe of a service that
    stopped answering (sent with a reply subject; rolled back when nobody listens)."""

    probe: bool


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
class PaceRow:
    """pace_view: one pipeline's pacing (db/functions/22_pacing.sql)."""

    pipeline: str
    mode: str
    in_flight_limit: int | None  # None: PACING=off
    pinned: bool
    in_flight: int
    queued: int
    held_back: int
    answering: bool
    silent_since: dt.datetime | None
    latency_seconds: float | None
    min_latency_seconds: float | None
    answers_per_second: float | None


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """status_series: one sample of the console's charts (db/functions/82_samples.sql)."""

    sampled_at: dt.datetime
    seconds: float | None
    finished: dict[str, int] | None
    queued: int
    oldest_queued_age_seconds: float
    waits: dict[str, dict[str, float]] | None


@dataclass(frozen=True, slots=True)
class BridgeInstance:
    """bridge_instances: a bridge that says it is alive, and how long since it last did
    (db/functions/84_bridges.sql)."""

    name: str
    version: str
    started_at: dt.datetime
    seen_seconds_ago: float
    nats: str
    listener: str
    loops: dict[str, str]
    held: int


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


@functools.cache
def _fields(cls: type[Any]) -> tuple[tuple[str, ...], dict[int, dict[Any, Any]]]:
    """A row class's field names, and for each enum field (`X` or `X | None`) its place
    and members by value, None for NULL: a dict lookup is three times faster than
    calling the enum, and the inbox builds up to 500 rows a batch."""
    hints = typing.get_type_hints(cls)
    names = tuple(f.name for f in fields(cls))
    enums = {}
    for i, name in enumerate(names):
        for hint in typing.get_args(hints[name]) or (hints[name],):
            if isinstance(hint, type) and issubclass(hint, Enum):
                enums[i] = {member.value: member for member in hint} | {None: None}
    return names, enums


def typed_row(cls: type[R]) -> BaseRowFactory[R]:
    """A row factory building `cls` (a dataclass) from each row, text converted to the
    enums its fields declare. The query's columns must be the fields, in their order:
    checked once per execute, so a query and its row class cannot drift apart silently."""
    # A class is hashable; mypy's Hashable protocol does not see type[...] as one.
    names, enums = _fields(cls)  # type: ignore[arg-type]

    def factory(cursor: Any) -> RowMaker[R]:
        if cursor.description is None:
            return no_result
        columns = tuple(c.name for c in cursor.description)
        if columns != names:
            raise TypeError(f"{cls.__name__} has the fields {names}; the query returns {columns}")

        def make(values: Sequence[Any]) -> R:
            converted = list(values)
            for i, members in enums.items():
                try:
                    converted[i] = members[converted[i]]
                except KeyError:  # a label a newer schema added, met mid-upgrade
                    raise ValueError(
                        f"the database returned {converted[i]!r} for {cls.__name__}."
                        f"{names[i]}, which this arm-core does not know"
                    ) from None
            return cls(*converted)

        return make

    return factory
