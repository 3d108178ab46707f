"""The log format (arm_core.logs): one event is one line whatever its values hold, and no
configured secret is written (issue 10, parts 2 and 5). The same forged job_id through
the real inbox of a running `arm-core bridge` is in tests/e2e/test_secrets.py."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest

from arm_core.logs import KeyValueFormatter, Redactor, escape, setup_logging

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d [A-Z]+ ")
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
    """A logger writing through KeyValueFormatter into a buffer, redacting one secret."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(KeyValueFormatter(Redactor(["S3cretPW-xyz", "tiny"])))
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
    assert STAMP.match(line) and line.count("2026-11-29T21:00:00 INFO") == 3
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
        assert isinstance(handler.formatter, KeyValueFormatter)
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s", ("S3cretPW-xyz",), None)
        assert handler.formatter.format(record).endswith("x: ***")
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
