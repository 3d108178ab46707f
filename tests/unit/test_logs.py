"""The log formats (arm_core.logs): one event is one line whatever its values hold, and no
configured secret is written, in the text format and in JSON;
every extra field is rendered, typed in JSON, and the time is UTC with milliseconds
(part 2). The same forged job_id through the real inbox of a running
`arm-core bridge` is in tests/e2e/test_secrets.py; a bridge with LOG_FORMAT=json in
tests/e2e/test_logs_json.py."""

from __future__ import annotations

import io
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from arm_core.config import ConfigError, Settings
from arm_core.logs import LogFormatter, Redactor, escape, setup_logging

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00 [A-Z]+ ")
JSON_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
FORGED = "x\n2026-11-29T21:00:00 INFO arm_core.bridge.inbox: result applied action=apply"


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("plain text, кириллица", "plain text, кириллица"),
        ("a\nb", "a\\nb"),
        ("a\rb", "a\\rb"),
        ("a\tb", "a\\tb"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("nul\x00 del\x7f nel\x85", "nul\\x00 del\\x7f nel\\x85"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("\u202eevil", "\\u202eevil"),
        ("vt\x0b ff\x0c fs\x1c", "vt\\x0b ff\\x0c fs\\x1c"),
        ("back\\slash and \\n as text", "back\\\\slash and \\\\n as text"),
    ],
)
def test_escape(raw: str, escaped: str) -> None:
    assert escape(raw) == escaped
    assert len(escape(raw).splitlines()) <= 1


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing text lines into a buffer, redacting one secret."""
    yield from _capture("text")


@pytest.fixture
def captured_json() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """The same, in JSON."""
    yield from _capture("json")


def _capture(fmt: str) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(LogFormatter(fmt, Redactor(["S3cretPW-xyz", "tiny"])))
    logger = logging.getLogger("arm_core.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)


def test_a_forged_value_stays_on_its_line(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.warning(
        "dropped a message from %s: %s",
        "files.tabular_parsed\r\n2026-11-29T21:00:00 INFO x: forged",
        FORGED,
        extra={"action": "inbox_drop", "reason": "schema", "job_id": FORGED, "msg_id": None},
    )
    text = out.getvalue()
    assert text.count("\n") == 1, text  # one line, and its end
    [line] = text.splitlines()
    assert STAMP.match(line) and line.count("2026-11-29T21:00:00 INFO") == 3, line
    assert "parsed\\r\\n2026-11-29" in line  # shown as escapes, not broken
    # a field with spaces is quoted, its quotes and backslashes escaped: logfmt can read it
    assert f' job_id="x\\n{FORGED[2:]}"' in line and " msg_id=None" in line


def test_quoting_keeps_fields_apart(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.info("m", extra={"reason": 'a" action=forged x="', "status": "", "error": "a\\b"})
    line = out.getvalue().rstrip("\n")
    assert line.endswith(' reason="a\\" action=forged x=\\"" status="" error=a\\\\b')


def test_a_traceback_follows_on_indented_lines(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = captured
    try:
        raise ValueError(f"bad input {FORGED}\x1b[2J")
    except ValueError:
        logger.exception("failed", extra={"action": "test"})
    first, *below = out.getvalue().rstrip("\n").split("\n")
    assert STAMP.match(first) and first.endswith("failed action=test")
    assert below and all(line.startswith("  ") for line in below), below
    assert below[0] == "  Traceback (most recent call last):"
    assert "\x1b" not in out.getvalue() and below[-1].endswith("\\x1b[2J")
    # the forged text is inside the traceback's last line: no line of its own
    assert not any(STAMP.match(line) for line in below)


def test_configured_secrets_are_redacted_everywhere(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = captured
    try:
        raise RuntimeError('invalid sslmode value: "S3cretPW-xyz"')
    except RuntimeError:
        logger.exception(
            "connect to postgresql://admin:%s@db failed",
            "S3cretPW-xyz",
            extra={"error": "S3cretPW-xyz\nsecond", "reason": "tiny"},
        )
    text = out.getvalue()
    assert "S3cretPW" not in text
    assert "postgresql://admin:***@db" in text and 'sslmode value: "***"' in text
    assert "error=***\\nsecond" in text
    # secrets shorter than Redactor.MIN_LENGTH are left: "tiny" would be everywhere
    assert "reason=tiny" in text


def test_redactor_prefers_the_longest_secret() -> None:
    redact = Redactor(["secret-one", "secret-one-and-more", "other-secret"])
    assert redact("x secret-one-and-more y other-secret") == "x *** y ***"
    assert Redactor()("nothing to hide") == "nothing to hide"


def test_setup_logging_installs_the_formatter_with_the_redactor() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging(debug=True, redact=Redactor(["S3cretPW-xyz"]))
        [handler] = root.handlers
        assert isinstance(handler.formatter, LogFormatter) and handler.formatter.fmt == "text"
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s", ("S3cretPW-xyz",), None)
        assert handler.formatter.format(record).endswith("x: ***")
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


# --- every extra field, UTC with its offset, and JSON -----------------

FIXED = datetime(2026, 11, 30, 5, 0, 0, 123000, tzinfo=UTC)


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is UTC+5: a local time would show 10:00."""
    monkeypatch.setenv("TZ", "Asia/Yekaterinburg")
    time.tzset()
    try:
        yield
    finally:
        monkeypatch.undo()
        time.tzset()


def fixed_record(msg: str = "m", *args: object, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord("arm_core.t", logging.INFO, __file__, 1, msg, args, None)
    record.created, record.msecs = FIXED.timestamp(), 123.0
    record.__dict__.update(fields)
    return record


@pytest.mark.usefixtures("far_from_utc")
def test_text_renders_every_extra_field_with_the_utc_offset() -> None:
    line = LogFormatter("text").format(
        fixed_record(
            "applied %s",
            "x",
            batch_size=7,
            attempt=2,
            action="result",
            consumer="q 1",
            job_id=uuid.UUID(int=1),
        )
    )
    # the known fields first (action, job_id, attempt), then the others as given
    assert line == (
        "2026-11-30T05:00:00.123+00:00 INFO arm_core.t: applied x action=result "
        'job_id=00000000-0000-0000-0000-000000000001 attempt=2 batch_size=7 consumer="q 1"'
    )


@pytest.mark.usefixtures("far_from_utc")
def test_json_is_one_typed_object_a_line() -> None:
    job = uuid.uuid4()
    line = LogFormatter("json").format(
        fixed_record(
            "result %s ignored",
            "x",
            action="result",
            job_id=job,
            attempt=2,
            reason="already_final",
            count=0,
            ratio=0.5,
            held=True,
            msg_id=None,
            detail={"ids": (1, 2), "at": FIXED},
            level="forged",  # an extra named like the line's own key is kept apart
        )
    )
    assert "\n" not in line
    doc = json.loads(line)
    assert list(doc)[:4] == ["timestamp", "level", "logger", "message"]
    assert doc == {
        "timestamp": "2026-11-30T05:00:00.123Z",
        "level": "info",
        "logger": "arm_core.t",
        "message": "result x ignored",
        "action": "result",
        "job_id": str(job),
        "attempt": 2,
        "reason": "already_final",
        "count": 0,
        "ratio": 0.5,
        "held": True,
        "msg_id": None,
        "detail": {"ids": [1, 2], "at": str(FIXED)},
        "extra_level": "forged",
    }


def test_a_json_line_carries_a_real_records_time(
    captured_json: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = captured_json
    before = datetime.now(UTC).replace(microsecond=0)
    logger.warning("w", extra={"action": "a"})
    doc = json.loads(out.getvalue())
    assert JSON_STAMP.match(doc["timestamp"]), doc
    stamp = datetime.fromisoformat(doc["timestamp"].replace("Z", "+00:00"))
    assert before <= stamp <= datetime.now(UTC)
    assert (doc["level"], doc["logger"]) == ("warning", "arm_core.test_logs")


def test_a_forged_value_stays_inside_its_json_line(
    captured_json: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = captured_json
    odd = "\r\x1b\x85\u2028\u2029\u202e\x00"
    logger.warning(
        "dropped a message from %s",
        f"files\n{FORGED}",
        extra={"action": "inbox_drop", "job_id": FORGED + odd},
    )
    text = out.getvalue()
    assert text.count("\n") == 1 and len(text.splitlines()) == 1, text
    assert not any(c in text for c in odd)  # written as escapes, not as themselves
    doc = json.loads(text)
    assert doc["job_id"] == FORGED + odd  # and read back as they were: nothing lost
    assert doc["message"] == f"dropped a message from files\n{FORGED}"


def test_json_exception_is_a_field_of_the_one_line(
    captured_json: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = captured_json
    try:
        raise ValueError(f"bad input {FORGED}")
    except ValueError:
        logger.exception("failed", extra={"action": "test"})
    [line] = out.getvalue().splitlines()
    doc = json.loads(line)
    assert (doc["level"], doc["message"], doc["action"]) == ("error", "failed", "test")
    assert doc["exception"].startswith("Traceback (most recent call last):\n")
    assert doc["exception"].endswith(f"ValueError: bad input {FORGED}")


def test_configured_secrets_are_redacted_in_json(
    captured_json: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = captured_json
    try:
        raise RuntimeError('invalid sslmode value: "S3cretPW-xyz"')
    except RuntimeError:
        logger.exception(
            "connect to postgresql://admin:%s@db failed",
            "S3cretPW-xyz",
            extra={
                "error": "S3cretPW-xyz\nsecond",
                "reason": "tiny",
                "dsn": {"S3cretPW-xyz": ["x S3cretPW-xyz", 1]},
                "url": uuid.UUID(int=7),
            },
        )
    text = out.getvalue()
    assert "S3cretPW" not in text
    doc = json.loads(text)
    assert doc["message"] == "connect to postgresql://admin:***@db failed"
    assert 'sslmode value: "***"' in doc["exception"]
    assert doc["error"] == "***\nsecond" and doc["reason"] == "tiny"
    assert doc["dsn"] == {"***": ["x ***", 1]}


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="'xml'"):
        LogFormatter("xml")


@pytest.mark.parametrize("value", ["xml", "JSONL", "json text", "jsn"])
def test_log_format_takes_text_or_json_and_names_what_it_refuses(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"LOG_FORMAT": value})
    assert str(refused.value) == f"LOG_FORMAT: expected one of text, json, got {value!r}"
    assert Settings.from_env({"LOG_FORMAT": "JSON"}).log_format == "json"  # any case
    assert Settings.from_env({"LOG_FORMAT": ""}).log_format == "text"  # empty: the default


def test_setup_logging_installs_the_json_format() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging(redact=Redactor(["S3cretPW-xyz"]), fmt="json")
        [handler] = root.handlers
        assert isinstance(handler.formatter, LogFormatter) and handler.formatter.fmt == "json"
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s", ("S3cretPW-xyz",), None)
        assert json.loads(handler.formatter.format(record))["message"] == "***"
        assert root.level == logging.INFO
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
