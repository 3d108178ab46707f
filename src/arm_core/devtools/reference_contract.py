"""What a reference recognition service (:mod:`arm_core.devtools.reference`) reads from a
request and writes in its answers, below the contract's schemas: a job as the service
remembers it (:class:`Job`), the ids and attempt read from a request (or from its
Nats-Msg-Id), a deadline passed, the `error` field of a result, and a file written
whole or not at all.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from arm_core.bridge.nats_client import MSG_ID_HEADER

MSG_ID = MSG_ID_HEADER

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the service remembers it: in work or answered (`acked` False: answered
    SCHEMA_MISMATCH without an ack)."""

    job_id: str
    file_id: str
    attempt: int
    acked: bool
    seen_at: float = field(default_factory=time.monotonic)


def uuid_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and _UUID.fullmatch(value) else None


def positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if value >= 1 else None


def clip(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_field(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": clip(message, 4000)}


def deadline_passed(reply_deadline: str) -> bool:
    try:
        return datetime.fromisoformat(reply_deadline.upper()) <= datetime.now(UTC)
    except ValueError:  # e.g. a leap second: RFC 3339 allows it, Python does not
        return False


def header_attempt(msg: Msg, job_id: str) -> int | None:
    """The attempt of the request's `Nats-Msg-Id: <job_id>:<attempt>`, if it is that."""
    head, _, tail = (msg.headers or {}).get(MSG_ID, "").rpartition(":")
    if head.lower() != job_id.lower() or not re.fullmatch(r"[1-9][0-9]{0,17}", tail):
        return None
    return int(tail)


def write_json(path: Path, content: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps(content, ensure_ascii=False, indent=2), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
