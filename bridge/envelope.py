"""Parsing and validating inbound envelopes: bytes and headers in, an :class:`Envelope`
or a :class:`Rejected` with a reason out. Nothing here raises on input, whatever it is."""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg

from arm_core.bridge.contracts import CONTRACT_MAJOR, RESULT_SCHEMA, other_major, problem
from arm_core.bridge.nats_client import MSG_ID_HEADER
from arm_core.statuses import JobStatus

# json.loads joins surrogate pairs; what is left cannot be encoded as UTF-8.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, eq=False)
class Envelope:
    """A schema-valid ack (`status = processing`) or result, with its Nats-Msg-Id.

    It holds what the database is given, as compact JSON text (`row_json`), not the
    parsed message: a message's parsed form can take many times its size in memory (a
    megabyte of `[{},{},…]` is hundreds of thousands of dicts), its text does not."""

    msg_id: str
    job_id: uuid.UUID
    status: JobStatus  # processing (an ack), done, needs_check or error
    # One element of arm.apply_envelopes_v2's JSON array (arm_core.store.Answer).
    row_json: str
    # What it costs the inbox's buffer, in bytes: its message's size as it came, twice
    # when the message itself is kept until acked (RESULTS_STREAM).
    size: int = 0
    # What had to change so PostgreSQL can store it (NUL characters, NaN/Infinity, lone
    # surrogates), as JSON paths; empty when the envelope is stored as it came.
    made_storable: tuple[str, ...] = ()
    # An ack that came without Nats-Msg-Id: msg_id is ack:<job_id>, made here.
    msg_id_derived: bool = False
    # The JSON paths cut to the caps (capped): stored cut, with the original length.
    truncated: tuple[str, ...] = ()
    # RESULTS_STREAM: the message it came in, settled once its outcome is final.
    msg: Msg | None = None
    # When it arrived (time.monotonic()).
    received_at: float = field(default_factory=time.monotonic)

    @property
    def is_ack(self) -> bool:
        return self.status is JobStatus.PROCESSING


def _row_json(body: dict[str, Any], msg_id: str, status: JobStatus) -> str:
    result_s3 = body.get("result_s3") or {}
    error = body.get("error") or {}
    row = {
        "job_id": body["job_id"],
        "file_id": body["file_id"],
        "msg_id": msg_id,
        "status": status.value,
        "service_name": body["service"]["name"],
        "service_version": body["service"]["version"],
        "result_bucket": result_s3.get("bucket"),
        "result_key": result_s3.get("key"),
        "result_schema_version": body.get("result_schema_version"),
        "error_code": error.get("code"),
        "error_message": error.get("message"),
        "metrics": body.get("metrics"),
    }
    # allow_nan=False: storable() has replaced every non-finite number; should one slip
    # through, this raises here (a rejected envelope) instead of in PostgreSQL.
    return json.dumps(row, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@dataclass(frozen=True)
class Rejected:
    """A message that is logged and dropped: why, and the job_id if one was readable."""

    reason: str
    detail: str
    job_id: str | None = None
    msg_id: str | None = None


def storable(value: Any, path: str = "") -> tuple[Any, list[str]]:
    """`value` as PostgreSQL can store it in text and jsonb columns, and the JSON paths
    that had to change: NUL characters are removed (text and jsonb cannot hold U+0000),
    NaN and ±Infinity become null (JSON has no such numbers; Python's json writes them),
    and lone UTF-16 surrogates become U+FFFD (they cannot be encoded as UTF-8)."""
    if isinstance(value, str):
        fixed = _LONE_SURROGATE.sub("\ufffd", value.replace("\x00", ""))
        return fixed, ([path or "/"] if fixed != value else [])
    if isinstance(value, float) and not math.isfinite(value):
        return None, [path or "/"]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        changed: list[str] = []
        for key, item in value.items():
            new_key, key_changed = storable(key)
            out[new_key], item_changed = storable(item, f"{path}/{new_key}")
            changed += [f"{path}/{new_key}"] * bool(key_changed) + item_changed
        return out, list(dict.fromkeys(changed))
    if isinstance(value, list):
        done = [storable(item, f"{path}/{i}") for i, item in enumerate(value)]
        return [item for item, _ in done], [p for _, changed in done for p in changed]
    return value, []


# What the core keeps of an answer's free text and metrics (docs/contracts/README.md,
# "Caps"): an answer is never dropped for its size within INBOX_MAX_PAYLOAD_BYTES.
TEXT_CAPS: tuple[tuple[str | None, str, int], ...] = (
    ("service", "name", 200),
    ("service", "version", 100),
    (None, "result_schema_version", 50),
    ("error", "message", 4000),
)
METRICS_KEYS_CAP = 100
METRICS_CUT_KEY = "_truncated_keys"


def capped(body: dict[str, Any]) -> list[str]:
    """Cuts `body`'s over-long text and metrics in place to the caps above; returns the
    JSON paths it cut."""
    cut: list[str] = []
    for parent, key, cap in TEXT_CAPS:
        holder = body.get(parent) if parent else body
        if isinstance(holder, dict):
            value = holder.get(key)
            if isinstance(value, str) and len(value) > cap:
                marker = f" …[truncated: {len(value)} characters]"
                holder[key] = value[: cap - len(marker)] + marker
                cut.append(f"/{parent}/{key}" if parent else f"/{key}")
    metrics = body.get("metrics")
    if isinstance(metrics, dict) and len(metrics) > METRICS_KEYS_CAP:
        kept = dict(list(metrics.items())[: METRICS_KEYS_CAP - 1])
        kept[METRICS_CUT_KEY] = len(metrics) - len(kept)
        body["metrics"] = kept
        cut.append("/metrics")
    return cut


# What can make a JSON text unstorable, as it shows in the raw bytes: a NUL or a lone
# surrogate can only come as a \u escape (raw control characters are invalid JSON, raw
# surrogates invalid UTF-8); a non-finite number as NaN, Infinity, or a number too large
# for a float (an exponent of three digits, or hundreds of digits). A false alarm only
# costs the walk; most envelopes match none and skip it.
_NEEDS_WALK = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])|NaN|Infinity|[eE]\+?\d{3}|\d{300}")


def parse_envelope(
    data: bytes, headers: dict[str, str] | None, max_bytes: int
) -> Envelope | Rejected:
    """Turns a NATS message into an Envelope, or says why it is dropped."""
    msg_id = (headers or {}).get(MSG_ID_HEADER)
    if len(data) > max_bytes:
        return Rejected("too_large", f"{len(data)} bytes > {max_bytes}", msg_id=msg_id)
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        return Rejected("not_json", str(exc)[:200], msg_id=msg_id)
    if not isinstance(body, dict):
        return Rejected("not_object", f"JSON {type(body).__name__}", msg_id=msg_id)
    job_id = body.get("job_id")
    job_id = job_id if isinstance(job_id, str) and len(job_id) <= 64 else None  # for the log
    if (major := other_major(body.get("schema_version"))) is not None:
        # A later MINOR is read (its new fields ignored); another MAJOR may mean anything.
        said = f"schema_version MAJOR {major}: this core reads MAJOR {CONTRACT_MAJOR}"
        return Rejected("schema_version_unsupported", said, job_id, msg_id)
    derived = False
    if not msg_id or not msg_id.strip():
        # An ack needs no id: nothing reads it (a repeated ack is told by the job's
        # status); it is named as the contract names it, less the attempt. A result's id
        # is how a repeated result is told from another one: without it, it is dropped.
        if body.get("status") != "processing" or job_id is None:
            return Rejected("missing_msg_id", f"no {MSG_ID_HEADER} header", job_id=job_id)
        msg_id, derived = f"ack:{job_id}", True
    if len(msg_id) > 200:
        return Rejected("bad_msg_id", f"{MSG_ID_HEADER} of {len(msg_id)} characters", job_id)
    if (why := problem(RESULT_SCHEMA, body)) is not None:
        return Rejected("schema", why, job_id, msg_id)
    # Schema-valid is recorded: what PostgreSQL cannot store as given is made storable.
    changed: list[str] = []
    if _NEEDS_WALK.search(data):
        body, changed = storable(body)
    truncated = capped(body)
    msg_id, msg_id_changed = storable(msg_id, "Nats-Msg-Id")
    status = JobStatus(body["status"])
    return Envelope(
        msg_id=msg_id,
        job_id=uuid.UUID(body["job_id"]),
        status=status,
        row_json=_row_json(body, msg_id, status),
        size=len(data),
        made_storable=tuple(msg_id_changed + changed),
        msg_id_derived=derived,
        truncated=tuple(truncated),
    )
