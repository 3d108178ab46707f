"""Message contracts (docs/behaviour.md#contracts): the JSON Schemas and their examples in
docs/contracts."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from arm_core.bridge import contracts

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts"
EXAMPLES = CONTRACTS / "examples"
REQUEST_SCHEMA = CONTRACTS / "recognition-request.schema.json"
RESULT_SCHEMA = CONTRACTS / "recognition-result-message.schema.json"
SCHEMAS = [REQUEST_SCHEMA, RESULT_SCHEMA]


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _schema_for(example: Path) -> Path:
    if example.name.startswith("request-"):
        return REQUEST_SCHEMA
    if example.name.startswith("result-"):
        return RESULT_SCHEMA
    raise AssertionError(f"example {example.name} is neither request-* nor result-*")


def _example(name: str) -> dict[str, Any]:
    return _load(EXAMPLES / name)


def _errors(schema_path: Path, instance: Any) -> list[str]:
    """What the runtime's compiled schema (bridge/contracts.py) finds wrong."""
    return [e.message for e in contracts.validator(schema_path.name).iter_errors(instance)]


ALL_EXAMPLES = sorted(EXAMPLES.glob("*.json"))


# --- schemas and examples -------------------------------------------------------------


@pytest.mark.parametrize("schema_path", SCHEMAS, ids=lambda p: p.name)
def test_schema_is_valid_draft_2020_12(schema_path: Path) -> None:
    schema = _load(schema_path)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"https://arm-core.local/contracts/{schema_path.name}"
    assert schema["title"] and schema["description"]
    jsonschema_rs.meta.validate(schema)


def test_date_time_format_is_really_checked() -> None:
    """A JSON Schema validator checks `format` only when told to (contracts.validator
    is): a reply_deadline with month 13 matches the field's pattern and is refused by
    its date-time format alone; a real one passes."""
    pattern = _load(REQUEST_SCHEMA)["properties"]["reply_deadline"]["pattern"]
    bad = "2030-13-01T12:00:00Z"
    assert re.search(pattern, bad)
    said = contracts.problem(contracts.REQUEST_SCHEMA, _request(reply_deadline=bad))
    assert said is not None and said.startswith("reply_deadline: "), said
    good = _request(reply_deadline="2030-01-01T12:10:00Z")
    assert contracts.problem(contracts.REQUEST_SCHEMA, good) is None


def test_examples_cover_every_message_kind() -> None:
    names = {p.name for p in ALL_EXAMPLES}
    assert {
        "request-tabular.json",
        "request-image.json",
        "result-processing.json",
        "result-done.json",
        "result-needs-check.json",
        "result-error.json",
        "result-error-scan.json",
    } <= names
    statuses = {_load(p)["status"] for p in ALL_EXAMPLES if p.name.startswith("result-")}
    assert statuses == {"processing", "done", "needs_check", "error"}


@pytest.mark.parametrize("example", ALL_EXAMPLES, ids=lambda p: p.name)
def test_example_validates_against_its_schema(example: Path) -> None:
    assert _errors(_schema_for(example), _load(example)) == []


def test_request_image_example_has_past_deadline_and_still_passes() -> None:
    request = _example("request-image.json")
    assert request["reply_deadline"] < "2025-01-01"
    assert _errors(REQUEST_SCHEMA, request) == []


@pytest.mark.parametrize("example", ALL_EXAMPLES, ids=lambda p: p.name)
def test_example_s3_keys_match_their_ids(example: Path) -> None:
    message = _load(example)
    file_id, job_id = message["file_id"], message["job_id"]
    if "s3" in message:
        assert message["s3"]["key"] == f"uploads/{file_id}/{message['original_name']}"
    if "result_s3" in message:
        assert message["result_s3"]["key"] == f"results/{file_id}/{job_id}/result.json"
    if "raw_s3_key" in message:
        assert message["service"]["name"] == "scan-gateway"
        assert f"/{file_id}/{job_id}/" in message["raw_s3_key"]


def test_s3_location_is_the_same_in_both_schemas() -> None:
    request, result = _load(REQUEST_SCHEMA), _load(RESULT_SCHEMA)
    assert request["$defs"]["s3_location"] == result["$defs"]["s3_location"]
    assert request["$defs"]["uuid"] == result["$defs"]["uuid"]


# --- requests that must fail ----------------------------------------------------------


def _request(**changes: Any) -> dict[str, Any]:
    request = copy.deepcopy(_example("request-tabular.json"))
    request.update(changes)
    return request


def _without_s3_key() -> dict[str, Any]:
    request = _request()
    del request["s3"]["key"]
    return request


BAD_REQUESTS = {
    "unknown file_type": _request(file_type="CSV"),
    "missing s3.key": _without_s3_key(),
    "empty s3.bucket": _request(s3={"bucket": "", "key": "uploads/x"}),
    "attempt 0": _request(attempt=0),
    "attempt not an integer": _request(attempt=1.5),
    "job_id not a uuid": _request(job_id="not-a-uuid"),
    "file_id uuid without dashes": _request(file_id="8b6e2d140a3f4c9eb7d51f4a9c3e6b20"),
    "reply_deadline not a date-time": _request(reply_deadline="tomorrow"),
    "reply_deadline month 13": _request(reply_deadline="2030-13-01T12:10:00Z"),
    "reply_deadline without offset": _request(reply_deadline="2030-01-01T12:10:00"),
    "reply_deadline not UTC": _request(reply_deadline="2030-01-01T15:10:00+03:00"),
    "tabular pipeline with PDF": _request(pipeline="tabular", file_type="PDF"),
    "image pipeline with XLSX": _request(pipeline="image", file_type="XLSX"),
    "unknown pipeline": _request(pipeline="audio"),
    "schema_version 2.0": _request(schema_version="2.0"),
    "empty original_name": _request(original_name=""),
    "huge original_name": _request(original_name="x" * 1025),
    "schema_version without MINOR": _request(schema_version="1"),
    "schema_version 1.01": _request(schema_version="1.01"),
}


@pytest.mark.parametrize("request_doc", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_request_is_rejected(request_doc: dict[str, Any]) -> None:
    assert _errors(REQUEST_SCHEMA, request_doc) != []


def test_a_later_minor_with_fields_this_version_does_not_know_passes() -> None:
    """The version rule: every MINOR of MAJOR 1 is valid, and a reader ignores the fields
    it does not know (a later MINOR may add them), in requests and results alike."""
    request = _request(schema_version="1.4", priority="high")
    request["s3"]["region"] = "ru"
    assert _errors(REQUEST_SCHEMA, request) == []
    result = _result("result-error.json", schema_version="1.12", confidence=0.5)
    result["error"]["hint"] = "retry"
    assert _errors(RESULT_SCHEMA, result) == []


@pytest.mark.parametrize("field", _example("request-tabular.json").keys())
def test_request_without_required_field_is_rejected(field: str) -> None:
    request = _request()
    del request[field]
    assert _errors(REQUEST_SCHEMA, request) != []


@pytest.mark.parametrize(
    ("pipeline", "file_type"),
    [
        ("tabular", "XLS"),
        ("tabular", "XLSX"),
        ("tabular", "XLSB"),
        ("image", "PDF"),
        ("image", "PNG"),
        ("image", "JPG"),
    ],
)
def test_matching_pipeline_and_file_type_pass(pipeline: str, file_type: str) -> None:
    assert _errors(REQUEST_SCHEMA, _request(pipeline=pipeline, file_type=file_type)) == []


# --- results that must fail -----------------------------------------------------------


def _result(example: str, *, drop: tuple[str, ...] = (), **changes: Any) -> dict[str, Any]:
    result = copy.deepcopy(_example(example))
    for field in drop:
        del result[field]
    result.update(changes)
    return result


BAD_RESULTS = {
    "done without result_s3": _result("result-done.json", drop=("result_s3",)),
    "done without result_schema_version": _result(
        "result-done.json", drop=("result_schema_version",)
    ),
    "needs_check without result_s3": _result("result-needs-check.json", drop=("result_s3",)),
    "error without error": _result("result-error.json", drop=("error",)),
    "error with unknown code": _result(
        "result-error.json", error={"code": "DISK_FULL", "message": "no space"}
    ),
    "error without message": _result("result-error.json", error={"code": "TIMEOUT"}),
    "unknown status": _result("result-done.json", status="finished"),
    "job_id not a uuid": _result("result-done.json", job_id="job-42"),
    "file_id not a uuid": _result("result-processing.json", file_id="8b6e2d14"),
    "service without version": _result("result-processing.json", service={"name": "x"}),
    "empty service name": _result("result-processing.json", service={"name": "", "version": "1"}),
    "metrics not an object": _result("result-done.json", metrics=[1, 2]),
    "schema_version 2.0": _result("result-done.json", schema_version="2.0"),
}


@pytest.mark.parametrize("result_doc", BAD_RESULTS.values(), ids=BAD_RESULTS.keys())
def test_bad_result_is_rejected(result_doc: dict[str, Any]) -> None:
    assert _errors(RESULT_SCHEMA, result_doc) != []


@pytest.mark.parametrize("field", ["schema_version", "job_id", "file_id", "status", "service"])
def test_ack_without_required_field_is_rejected(field: str) -> None:
    assert _errors(RESULT_SCHEMA, _result("result-processing.json", drop=(field,))) != []


@pytest.mark.parametrize(
    "result_doc",
    [
        _result("result-error.json", error={"code": "UNREADABLE", "message": "x" * 100_000}),
        _result("result-processing.json", service={"name": "x" * 1_000_000, "version": "1"}),
        _result("result-done.json", metrics={f"m{i}": i for i in range(500)}),
    ],
    ids=["huge error message", "huge service name", "500 metrics"],
)
def test_long_text_and_many_metrics_are_valid_and_cut_by_the_core(
    result_doc: dict[str, Any],
) -> None:
    """The seeds set no size limits on an answer's text: the schema takes it, the core
    stores it cut to its caps (bridge/envelope.py capped; tests/bridge/test_inbox.py)."""
    assert _errors(RESULT_SCHEMA, result_doc) == []


def test_error_may_carry_result_s3() -> None:
    result = _result(
        "result-error.json",
        result_s3={"bucket": "arm-ka", "key": "results/f/j/result.json"},
    )
    assert _errors(RESULT_SCHEMA, result) == []


ERROR_CODES = [
    "UNSUPPORTED_FORMAT",
    "UNREADABLE",
    "TIMEOUT",
    "SCHEMA_MISMATCH",
    "NOT_IMPLEMENTED",
    "FILE_READ_ERROR",
    "INVALID_FORMAT",
    "INVALID_DOCUMENT",
    "RECOGNITION_FAILED",
    "UNKNOWN_ERROR",
]


def test_error_codes_are_exactly_those_of_the_spec() -> None:
    schema = _load(RESULT_SCHEMA)
    assert schema["properties"]["error"]["properties"]["code"]["enum"] == ERROR_CODES


@pytest.mark.parametrize("code", ERROR_CODES)
def test_every_error_code_is_accepted(code: str) -> None:
    result = _result("result-error.json", error={"code": code, "message": "m"})
    assert _errors(RESULT_SCHEMA, result) == []


# --- what a refusal says -----------------------------------------------------------------

MORE_BAD_RESULTS = {
    "not an object": [1, 2],
    "job_id with a newline": _result("result-done.json", job_id="a\nb"),
    "schema_version a number": _result("result-done.json", schema_version=1.0),
}


@pytest.mark.parametrize(
    "doc",
    [*BAD_RESULTS.values(), *MORE_BAD_RESULTS.values()],
    ids=[*BAD_RESULTS.keys(), *MORE_BAD_RESULTS.keys()],
)
def test_a_refused_result_is_said_why_and_where(doc: Any) -> None:
    """contracts.problem (what the inbox logs when it drops an envelope) says why
    whenever the schema refuses, and nothing when it passes."""
    said = contracts.problem(contracts.RESULT_SCHEMA, doc)
    assert said is not None and ": " in said, said


@pytest.mark.parametrize("example", ALL_EXAMPLES, ids=lambda p: p.name)
def test_a_valid_message_has_no_problem(example: Path) -> None:
    assert contracts.problem(_schema_for(example).name, _load(example)) is None


def test_the_problem_named_is_the_one_highest_in_the_document() -> None:
    """Two faults: a required field missing at the top, a wrong type below it. The top
    one is named (the shortest path), with its path; a long message is cut."""
    doc = _result("result-done.json", drop=("result_s3",), service={"name": "", "version": "1"})
    said = contracts.problem(contracts.RESULT_SCHEMA, doc)
    assert said is not None and said.startswith("(top): ") and "result_s3" in said, said
    said = contracts.problem(contracts.RESULT_SCHEMA, _result("result-done.json", job_id="j" * 999))
    assert said is not None and said.startswith("job_id: ") and len(said) <= len("job_id: ") + 300
