"""The message contracts of docs/contracts, compiled once."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator

import arm_core

# docs/contracts, mapped to arm_core.contracts by package-dir (pyproject.toml).
CONTRACTS_DIR = Path(arm_core.__file__).parent / "contracts"

REQUEST_SCHEMA = "recognition-request.schema.json"
RESULT_SCHEMA = "recognition-result-message.schema.json"

# The MAJOR of `schema_version` both sides read. Any MINOR of it is read, its new fields
# ignored; another MAJOR may mean anything and is refused (schema_version_unsupported).
CONTRACT_MAJOR = 1
_VERSION = re.compile(r"([0-9]{1,9})\.[0-9]{1,9}")


def other_major(version: object) -> int | None:
    """The MAJOR of a well-formed schema_version that is not CONTRACT_MAJOR, else None
    (a malformed one is the schema's to refuse)."""
    if isinstance(version, str) and (m := _VERSION.fullmatch(version)):
        major = int(m.group(1))
        return major if major != CONTRACT_MAJOR else None
    return None


@cache
def schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONTRACTS_DIR / name).read_text(encoding="utf-8"))
    return loaded


@cache
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(schema(name), format_checker=Draft202012Validator.FORMAT_CHECKER)


@cache
def fast_validator(name: str) -> Any:
    """The same schema compiled by jsonschema-rs to native code: jsonschema's check, in
    Python, was the inbox's bottleneck at thousands of envelopes per second. It decides
    valid or not; jsonschema (above) explains a rejection, and
    tests/unit/test_contracts.py checks that both agree on every example and bad case."""
    return jsonschema_rs.validator_for(schema(name), validate_formats=True)
