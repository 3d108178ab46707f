"""Structured logs: one line per event, `key=value` fields after the message.

Every line about a job carries job_id, attempt and an action; ignored messages add a
reason (pass them with ``extra=``, as Procrastinate does).

Two rules hold for every line, whatever a value holds, and live here in one place so a
different log format (structlog, JSON) can call them too:

- **One event, one line.** :func:`escape` writes a newline, a carriage return and every
  other control character as an escape (``\\n``, ``\\r``, ``\\x1b``, …) in the message,
  in its arguments and in every field, so no value — a job_id read from a rejected
  envelope, an error text from a driver — can start a line that looks like another
  event. A traceback follows its event on lines that start with two spaces, never with
  a timestamp.
- **No secret.** :class:`Redactor` replaces every configured secret (passwords of
  DATABASE_URL and NATS_URL, the NATS seed and JWT, the API tokens; see
  ``Settings.secrets``) by ``***`` wherever it turns up: a driver that echoes the
  connection string it could not parse does not put the password in the log.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable

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
    c = match.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    code = ord(c)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape(value: object) -> str:
    """`value` as text on one line: a backslash doubled, a newline as ``\\n``, a
    carriage return as ``\\r``, a tab as ``\\t``, any other control or line-breaking
    character as ``\\xNN`` / ``\\uNNNN``. Text without any is returned as it is."""
    text = str(value)
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape_char, text)


class Redactor:
    """Replaces each of a set of secret strings by ``***``.

    Secrets shorter than MIN_LENGTH are left out: replacing every "arm" or "1234" in
    every line would make the log unreadable, and the values a short password could be
    mistaken for are everywhere. The URL and token messages of arm_core.config mask by
    position and do not depend on this; it is the net under a driver's own message."""

    MIN_LENGTH = 6

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        kept = sorted({s for s in secrets if len(s) >= self.MIN_LENGTH}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, kept))) if kept else None

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub("***", text)


def _quote(value: object) -> str:
    text = escape(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return '"' + text.replace('"', '\\"') + '"'
    return text


class KeyValueFormatter(logging.Formatter):
    """`2026-11-29T21:00:00 INFO arm_core.bridge.inbox: result ignored action=… job_id=…`

    The message (with its arguments), the logger's name and every field are redacted
    and escaped (see the module's docstring); a traceback or stack follows on lines
    indented by two spaces."""

    def __init__(self, redact: Redactor | None = None) -> None:
        super().__init__(None, "%Y-%m-%dT%H:%M:%S")
        self.redact = redact or Redactor()

    def clean(self, value: object) -> str:
        return escape(self.redact(str(value)))

    def format(self, record: logging.LogRecord) -> str:
        message = self.clean(record.getMessage())
        line = f"{self.formatTime(record, self.datefmt)} {record.levelname} "
        line += f"{self.clean(record.name)}: {message}"
        pairs = [
            f"{k}={_quote(self.redact(str(getattr(record, k))))}"
            for k in FIELDS
            if hasattr(record, k)
        ]
        if pairs:
            line += " " + " ".join(pairs)
        below: list[str] = []
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            below += record.exc_text.splitlines()
        if record.stack_info:
            below += self.formatStack(record.stack_info).splitlines()
        return line + "".join("\n  " + self.clean(text) for text in below)


def setup_logging(debug: bool = False, redact: Redactor | None = None) -> None:
    """Every log line to stderr through KeyValueFormatter, with `redact`'s secrets
    masked."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter(redact))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    # nats-py and aiohttp's access log are chatty at DEBUG; keep them at INFO.
    for name in ("nats", "aiohttp.access"):
        logging.getLogger(name).setLevel(logging.INFO)
