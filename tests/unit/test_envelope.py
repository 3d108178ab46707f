"""Making schema-valid input storable: what PostgreSQL's text and jsonb cannot
hold is replaced, everything else is left exactly as it came."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest

from arm_core.bridge.envelope import Envelope, parse_envelope, storable


@pytest.mark.parametrize(
    ("value", "expected", "paths"),
    [
        ("plain", "plain", []),
        ("a\x00b\x00", "ab", ["/"]),
        ("lone \ud800 surrogate", "lone \ufffd surrogate", ["/"]),
        (float("nan"), None, ["/"]),
        (float("-inf"), None, ["/"]),
        (1.5, 1.5, []),
        (10**30, 10**30, []),
        ({"k\x00": "v\x00"}, {"k": "v"}, ["/k"]),
        ({"a": [1, float("inf"), {"b": "\x00"}]}, {"a": [1, None, {"b": ""}]}, ["/a/1", "/a/2/b"]),
        (None, None, []),
        (True, True, []),
    ],
)
def test_storable(value: Any, expected: Any, paths: list[str]) -> None:
    fixed, changed = storable(value)
    assert fixed == expected
    assert changed == paths
    json.dumps(fixed, allow_nan=False).encode("utf-8")  # storable means this works


def test_a_result_with_nul_and_nan_parses_into_a_storable_envelope() -> None:
    job_id, file_id = uuid.uuid4(), uuid.uuid4()
    body = {
        "schema_version": "1.0",
        "job_id": str(job_id),
        "file_id": str(file_id),
        "status": "error",
        "service": {"name": "tabular-parser", "version": "1"},
        "error": {"code": "UNSUPPORTED_FORMAT", "message": "bad\u0000 sheet"},
        "metrics": {"rows": float("nan")},
    }
    parsed = parse_envelope(json.dumps(body).encode(), {"Nats-Msg-Id": "r:1"}, 1 << 20)
    assert isinstance(parsed, Envelope)
    assert parsed.made_storable == ("/error/message", "/metrics/rows")
    row = json.loads(parsed.row_json)
    assert row["error_message"] == "bad sheet" and row["metrics"] == {"rows": None}
    assert row["job_id"] == str(job_id) and row["status"] == "error"
    assert not any(isinstance(v, float) and math.isnan(v) for v in row.values())


def test_a_clean_envelope_is_not_marked() -> None:
    body = {
        "schema_version": "1.0",
        "job_id": str(uuid.uuid4()),
        "file_id": str(uuid.uuid4()),
        "status": "processing",
        "service": {"name": "tabular-parser", "version": "1"},
    }
    parsed = parse_envelope(json.dumps(body).encode(), {"Nats-Msg-Id": "a:1"}, 1 << 20)
    assert isinstance(parsed, Envelope) and parsed.made_storable == ()


@pytest.mark.parametrize(
    ("raw_metrics", "expected", "changed"),
    [
        (b'{"rows": 1e999}', {"rows": None}, True),  # valid JSON, inf in Python
        (b'{"rows": -Infinity}', {"rows": None}, True),
        (b'{"rows": 1' + b"0" * 400 + b".5}", {"rows": None}, True),  # too large: inf
        (b'{"note": "a\\u0000b"}', {"note": "ab"}, True),
        (b'{"note": "\\uDC00"}', {"note": "\ufffd"}, True),
        (b'{"note": "\\\\u0000 is not a NUL"}', {"note": "\\u0000 is not a NUL"}, False),
        (b'{"rows": 12, "ratio": 0.5}', {"rows": 12, "ratio": 0.5}, False),
    ],
)
def test_what_the_raw_text_says_decides_the_walk(
    raw_metrics: bytes, expected: Any, changed: bool
) -> None:
    """parse_envelope walks the body only when the text can hold something unstorable;
    whatever the path, the stored metrics are storable and otherwise unchanged."""
    head = json.dumps(
        {
            "schema_version": "1.0",
            "job_id": str(uuid.uuid4()),
            "file_id": str(uuid.uuid4()),
            "status": "done",
            "service": {"name": "tabular-parser", "version": "1"},
            "result_s3": {"bucket": "arm-ka", "key": "results/x/result.json"},
            "result_schema_version": "1.0",
        }
    ).encode()
    data = head[:-1] + b', "metrics": ' + raw_metrics + b"}"
    parsed = parse_envelope(data, {"Nats-Msg-Id": "r:1"}, 1 << 20)
    assert isinstance(parsed, Envelope), parsed
    assert json.loads(parsed.row_json)["metrics"] == expected
    assert bool(parsed.made_storable) == changed
