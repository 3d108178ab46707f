"""The message contracts of docs/contracts, compiled once by jsonschema-rs (JSON Schema
2020-12 in native code, "date-time" and "uuid" formats checked): the inbox checks every
envelope against the result schema, so a check in Python was its bottleneck in a burst
(the benchmark's `contracts` section measures the two side by side)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema_rs import Draft202012Validator

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
    """Schema `name` compiled, formats checked: `is_valid` for the hot path."""
    return Draft202012Validator(schema(name), validate_formats=True)


def problem(name: str, body: Any, limit: int = 300) -> str | None:
    """Why `body` breaks schema `name` (None: it does not), as `<where>: <message>` —
    the error highest in the document (the shortest path; of those, the first the
    schema finds), `where` its JSON path or `(top)`, the message cut to `limit`."""
    compiled = validator(name)
    if compiled.is_valid(body):
        return None
    # is_valid and iter_errors are one engine's: an invalid body has an error.
    error = min(compiled.iter_errors(body), key=lambda e: len(e.instance_path))
    where = "/".join(str(part) for part in error.instance_path) or "(top)"
    return f"{where}: {error.message[:limit]}"
