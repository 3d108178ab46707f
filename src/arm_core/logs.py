"""Structured logs: one line per event, for people (``LOG_FORMAT=text``, the default) or
for machines (``LOG_FORMAT=json``), on stderr, rendered by structlog's
ProcessorFormatter from the standard library's records and their ``extra=`` fields
(docs/logs-and-metrics.md shows both formats).

Two rules hold for every line in both formats, whatever a value holds:

- **One event, one line.** :func:`escape` writes every control and line-breaking
  character as an escape in the message, its arguments and every field of a text line,
  so no value — a job_id read from a rejected envelope, a driver's error text — can
  start a line that looks like another event. JSON escapes the C0 controls by nature;
  the other line breakers and the bidirectional overrides are written as ``\\uNNNN``.
- **No secret.** :class:`Redactor` replaces every configured secret (``Settings.secrets``)
  by ``***`` wherever it turns up: a driver that echoes the connection string it could
  not parse does not put the password in the log.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog
from structlog.typing import EventDict

FIELDS = (
    "action",
    "job_id",
    "attempt",
    "file_id",
    "outcome",
    "reason",
    "status",
    "msg_id",
    "subject",
    "count",
    "error",
)

# What escape() rewrites: the backslash (so an escape in the output is never ambiguous),
# C0 controls (newline, carriage return, tab, ESC, …), DEL, C1 controls (NEL included),
# the Unicode line and paragraph separators (str.splitlines breaks on them) and the
# bidirectional overrides (text that reads differently from what it is).
_UNSAFE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    hexed = f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"
    return _NAMED.get(match.group(), hexed)


def escape(value: object) -> str:
    """`value` as text on one line: _UNSAFE's characters as ``\\n``, ``\\xNN``, …"""
    return _UNSAFE.sub(_escape_char, str(value))


class Redactor:
    """Replaces each of a set of secret strings by ``***``.

    Secrets shorter than MIN_LENGTH are left out: replacing every "arm" or "1234" in
    every line would make the log unreadable, and the values a short password could be
    mistaken for are everywhere. The URL and token messages of arm_core.config_* mask by
    position (arm_core.redaction) and do not depend on this; it is the net under a
    driver's own message."""

    MIN_LENGTH = 6

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        kept = sorted({s for s in secrets if len(s) >= self.MIN_LENGTH}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, kept))) if kept else None

    def __call__(self, text: str) -> str:
        return self._pattern.sub("***", text) if self._pattern else text


def _quote(value: object) -> str:
    text = escape(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return '"' + text.replace('"', '\\"') + '"'
    return text


# The attributes every LogRecord has (and those a formatter or structlog adds): whatever
# else a record carries came from ``extra=``.
_RECORD_KEYS = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "_logger",
    "_name",
    "_from_structlog",
    "_record",
}
CORE = ("timestamp", "level", "logger", "message")
_BELOW = ("exception", "stack")

# Characters json.dumps leaves as they are but that break a line for some readers
# (str.splitlines, editors, terminals) or read differently from what they are.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _from_record(utc_suffix: str) -> structlog.typing.Processor:
    """structlog's foreign_pre_chain step: the record's time (UTC, milliseconds), level,
    logger, message, then its ``extra=`` fields, FIELDS first. An extra named like one of
    the line's own keys (``level``, ``exception``, …) is kept as ``extra_<name>``."""

    def step(_: Any, __: str, event_dict: EventDict) -> EventDict:
        record: logging.LogRecord = event_dict["_record"]
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        out: EventDict = {
            "timestamp": f"{stamp}.{int(record.msecs):03d}{utc_suffix}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": event_dict.pop("event"),
        }
        given = {k: v for k, v in vars(record).items() if k not in _RECORD_KEYS}
        ordered = [k for k in FIELDS if k in given] + [k for k in given if k not in FIELDS]
        for key in ordered:
            out[f"extra_{key}" if key in CORE or key in _BELOW else key] = given[key]
        stack = event_dict.pop("stack_info", None)
        out.update(event_dict)  # _record, _from_structlog, exc_info
        if stack:
            out["stack"] = stack
        return out

    return step


def _jsonable(value: object, redact: Redactor) -> object:
    """`value` as JSON can hold it, every text redacted: numbers, booleans and null as
    they are; a mapping or a sequence item by item; anything else (a UUID, a datetime, an
    exception) as its text."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {redact(str(k)): _jsonable(v, redact) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v, redact) for v in value]
    return redact(str(value))


def _redacted(redact: Redactor, typed: bool) -> structlog.typing.Processor:
    """The step before the renderer: every value of the line redacted (and, for JSON,
    made JSON-typed)."""

    def step(_: Any, __: str, event_dict: EventDict) -> EventDict:
        if typed:
            return {redact(k): _jsonable(v, redact) for k, v in event_dict.items()}
        return {redact(k): redact(str(v)) for k, v in event_dict.items()}

    return step


def _dumps(event_dict: EventDict, **_: Any) -> str:
    text = json.dumps(event_dict, ensure_ascii=False, default=str)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _render_text(_: Any, __: str, event_dict: EventDict) -> str:
    """`2026-11-30T05:00:00.123+00:00 INFO arm_core.bridge.inbox: result ignored action=…
    job_id=…`, a traceback or stack on the lines below indented by two spaces; every
    value already redacted, escaped here."""
    d = dict(event_dict)
    line = f"{d.pop('timestamp')} {d.pop('level').upper()} "
    line += f"{escape(d.pop('logger'))}: {escape(d.pop('message'))}"
    below = [text for key in _BELOW for text in d.pop(key, "").splitlines()]
    if d:
        line += " " + " ".join(f"{escape(k)}={_quote(v)}" for k, v in d.items())
    return line + "".join("\n  " + escape(text) for text in below)


class LogFormatter(structlog.stdlib.ProcessorFormatter):
    """A stdlib formatter rendering each record through structlog as JSON or key=value
    text, with `redact`'s secrets masked."""

    def __init__(self, fmt: str = "text", redact: Redactor | None = None) -> None:
        if fmt not in ("text", "json"):
            raise ValueError(f"log format {fmt!r}: expected text or json")
        self.fmt = fmt
        as_json = fmt == "json"
        super().__init__(
            foreign_pre_chain=[
                _from_record("Z" if as_json else "+00:00"),
                structlog.processors.format_exc_info,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _redacted(redact or Redactor(), typed=as_json),
                structlog.processors.JSONRenderer(serializer=_dumps) if as_json else _render_text,
            ],
        )


def setup_logging(
    debug: bool = False,
    redact: Redactor | None = None,
    fmt: str = "text",
    handlers: list[logging.Handler] | None = None,
) -> None:
    """Every log line through LogFormatter (`fmt`: text or json), with `redact`'s secrets
    masked, to `handlers` (stderr when none are given)."""
    handlers = handlers or [logging.StreamHandler(sys.stderr)]
    formatter = LogFormatter(fmt, redact)
    for handler in handlers:
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    # nats-py and aiohttp's access log are chatty at DEBUG; keep them at INFO.
    for name in ("nats", "aiohttp.access"):
        logging.getLogger(name).setLevel(logging.INFO)
