"""GET /api/v1/files: the file list of operators and of the console (docs/operators.md).

The cursor is the keyset of the last file of a page, (created_at, id), as
base64url("v1:<created_at in µs since the epoch>:<uuid>:<check>") without padding, the
check being 8 hex digits of the SHA-256 of what precedes it: opaque to clients, exact
(PostgreSQL keeps microseconds), the same from every API process, and checked on the way
back in. The check is no secret (a keyset shows nothing the list does not); it catches
corruption, not forgery.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import re
import uuid
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from aiohttp import web
from multidict import MultiDict

from arm_core.http.errors import ApiError, invalid_parameter
from arm_core.http.keys import STORE
from arm_core.rows import FileListFilter, FileListItem
from arm_core.statuses import FileStatus, FileType, JobStatus

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_Q_CHARS = 200
MAX_CURSOR_CHARS = 100

# Which parameters there are, and which may be repeated (or hold a comma-separated list).
_REPEATABLE = {"status", "job_status", "file_type"}
_SINGLE = {"consolidation_id", "q", "updated_after", "updated_before", "limit", "cursor"}

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)
_CURSOR_TEXT = re.compile(r"v1:(-?[0-9]{1,18}):([0-9a-f-]{36}):[0-9a-f]{8}")

E = TypeVar("E", bound=StrEnum)


def _enums(params: MultiDict[str], parameter: str, enum: type[E]) -> tuple[E, ...]:
    found: dict[E, None] = {}
    for raw in params.getall(parameter, []):
        for value in raw.split(","):
            try:
                found[enum(value)] = None
            except ValueError:
                allowed = ", ".join(member.value for member in enum)
                raise invalid_parameter(
                    parameter, f"{value[:40]!r} is not one of {allowed}"
                ) from None
    return tuple(found)


def _uuid(parameter: str, raw: str | None) -> uuid.UUID | None:
    if raw is None:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise invalid_parameter(parameter, f"not a uuid: {raw[:64]!r}") from None


def _timestamp(parameter: str, raw: str | None) -> dt.datetime | None:
    if raw is None:
        return None
    try:
        value = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise invalid_parameter(parameter, f"not an ISO 8601 timestamp: {raw[:64]!r}") from None
    if value.tzinfo is None:
        raise invalid_parameter(parameter, "the timestamp needs a time zone (Z or ±hh:mm)")
    return value


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise invalid_parameter(
            "limit", f"must be an integer from 1 to {MAX_LIMIT}, not {raw[:20]!r}"
        )
    return int(raw)


def _q(raw: str | None) -> str | None:
    if raw is None or raw == "":
        return None
    if len(raw) > MAX_Q_CHARS:
        raise invalid_parameter("q", f"at most {MAX_Q_CHARS} characters")
    if "\x00" in raw:
        raise invalid_parameter("q", "contains a NUL character")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid_parameter("q", "is not valid UTF-8") from None
    return raw


def encode_cursor(created_at: dt.datetime, file_id: uuid.UUID) -> str:
    keyset = f"v1:{(created_at - _EPOCH) // _MICROSECOND}:{file_id}"
    text = f"{keyset}:{hashlib.sha256(keyset.encode()).hexdigest()[:8]}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(raw: str) -> tuple[dt.datetime, uuid.UUID]:
    """The keyset a cursor of encode_cursor holds; INVALID_CURSOR for anything else."""
    invalid = ApiError(400, "INVALID_CURSOR", "the cursor is not one this API gave out")
    if len(raw) > MAX_CURSOR_CHARS:
        raise invalid
    try:
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("ascii")
        match = _CURSOR_TEXT.fullmatch(text)
        if match is None:
            raise invalid
        created_at = _EPOCH + int(match[1]) * _MICROSECOND
        file_id = uuid.UUID(match[2])
    except (binascii.Error, UnicodeDecodeError, ValueError, OverflowError):
        raise invalid from None
    # Encoding the keyset again gives the cursor back only when its check is right and
    # it is spelt as this API spells it (one spelling per keyset).
    if encode_cursor(created_at, file_id) != raw:
        raise invalid
    return created_at, file_id


def _utc(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat()


def item(row: FileListItem) -> dict[str, Any]:
    """One file of the list as the API shows it (http/openapi.json FileListItem)."""
    return {
        "id": str(row.id),
        "consolidation_id": str(row.consolidation_id) if row.consolidation_id else None,
        "original_name": row.original_name,
        "file_type": row.file_type,
        "status": row.status,
        "s3": {"bucket": row.s3_bucket, "key": row.s3_key},
        "created_at": _utc(row.created_at),
        "updated_at": _utc(row.updated_at),
        "current_job": None
        if row.job_id is None
        else {
            "job_id": str(row.job_id),
            "status": row.job_status,
            "attempt": row.attempt,
            "max_attempts": row.max_attempts,
            "error_code": row.error_code,
        },
        "retryable": row.retryable,
    }


async def list_files(request: web.Request) -> web.Response:
    """GET /api/v1/files → {"items": [...], "next_cursor": "…" | null}, newest first. The
    query string is read as sent: percent-decoded here once, + as a space, invalid UTF-8
    as U+FFFD."""
    params = MultiDict(parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True))
    unknown = sorted(set(params) - _REPEATABLE - _SINGLE)
    if unknown:
        raise invalid_parameter(unknown[0][:40], "unknown parameter")
    for name in _SINGLE:
        if len(params.getall(name, [])) > 1:
            raise invalid_parameter(name, "given more than once")
    where = FileListFilter(
        statuses=_enums(params, "status", FileStatus),
        job_statuses=_enums(params, "job_status", JobStatus),
        consolidation_id=_uuid("consolidation_id", params.get("consolidation_id")),
        file_types=_enums(params, "file_type", FileType),
        q=_q(params.get("q")),
        updated_after=_timestamp("updated_after", params.get("updated_after")),
        updated_before=_timestamp("updated_before", params.get("updated_before")),
    )
    cursor = params.get("cursor")
    keyset = decode_cursor(cursor) if cursor else None
    limit = _limit(params.get("limit"))
    rows = await request.app[STORE].list_files(limit + 1, where, keyset)  # +1: is there more?
    page = rows[:limit]
    next_cursor = encode_cursor(page[-1].created_at, page[-1].id) if len(rows) > limit else None
    return web.json_response({"items": [item(r) for r in page], "next_cursor": next_cursor})
