"""Structured logs: one line per event, `key=value` fields after the message.

Every line about a job carries job_id, attempt and an action; ignored messages add a
reason (pass them with ``extra=``, as Procrastinate does).
"""

from __future__ import annotations

import logging
import sys

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


def _quote(value: object) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


class KeyValueFormatter(logging.Formatter):
    """`2026-11-29T21:00:00 INFO arm_core.bridge.inbox: result ignored action=… job_id=…`"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        pairs = [f"{k}={_quote(getattr(record, k))}" for k in FIELDS if hasattr(record, k)]
        if pairs:
            head, sep, tail = line.partition("\n")  # keep a traceback below the fields
            line = head + " " + " ".join(pairs) + sep + tail
        return line


def setup_logging(debug: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    # nats-py and aiohttp's access log are chatty at DEBUG; keep them at INFO.
    for name in ("nats", "aiohttp.access"):
        logging.getLogger(name).setLevel(logging.INFO)
