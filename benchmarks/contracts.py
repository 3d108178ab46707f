"""The inbox's schema check: answers checked per second against the result schema by
jsonschema-rs, the engine the runtime uses (bridge/contracts.py), beside the pure-Python
`jsonschema` (Draft202012Validator with its format checker: the bench extra), in one
run, on one core, on the same answers.

The answers are the contract's result examples (docs/contracts/examples/result-*.json:
an ack, done, needs_check and two errors), each with fresh job and file ids, taken in
turn; one in ten is made invalid (an unknown status), as a drop the inbox must explain.
Each engine checks every answer once (`is_valid`, the inbox's hot path) in rounds, each
engine in turn, until it has run for at least a second a round; the figure is the best
round's rate, so a pause of the machine does not count. Both must decide alike on every
answer, or the section fails. Then `parse_envelope` on the same answers as bytes: the
whole check the inbox makes of an answer (JSON, version, the schema, storability).
No database and no NATS."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

from jsonschema import Draft202012Validator

from arm_core.bridge import contracts
from arm_core.bridge.envelope import parse_envelope
from benchmarks.harness import Bench
from benchmarks.report import Report

SECTION = "14 contracts"
ROUNDS = 3
ROUND_SECONDS = 1.0
INVALID_EVERY = 10


def answers(n: int) -> list[dict[str, Any]]:
    """n answers as services send them: the result examples in turn, fresh ids, every
    INVALID_EVERY-th with an unknown status."""
    examples = sorted(contracts.CONTRACTS_DIR.glob("examples/result-*.json"))
    bodies = [json.loads(path.read_text(encoding="utf-8")) for path in examples]
    made = []
    for i in range(n):
        body = {**bodies[i % len(bodies)], "job_id": str(uuid.uuid4())}
        body["file_id"] = str(uuid.uuid4())
        if i % INVALID_EVERY == INVALID_EVERY - 1:
            body["status"] = "finished"
        made.append(body)
    return made


def rate(check: Callable[[Any], object], items: list[Any]) -> float:
    """The best of ROUNDS rounds, items checked per second; each round repeats the
    items until it has run ROUND_SECONDS."""
    best = 0.0
    for _ in range(ROUNDS):
        done, began = 0, time.perf_counter()
        while (took := time.perf_counter() - began) < ROUND_SECONDS:
            for item in items:
                check(item)
            done += len(items)
        best = max(best, done / took)
    return best


def run(bench: Bench, report: Report) -> None:
    n = 2_000 if bench.sizes.latency_seconds < 10 else 10_000
    bodies = answers(n)
    schema = contracts.schema(contracts.RESULT_SCHEMA)
    python = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    native = contracts.validator(contracts.RESULT_SCHEMA)
    disagree = [b for b in bodies if python.is_valid(b) != native.is_valid(b)]
    if disagree:
        raise RuntimeError(f"the engines disagree on {len(disagree)} answers: {disagree[0]}")
    valid = sum(native.is_valid(b) for b in bodies)
    datas = [json.dumps(b).encode() for b in bodies]
    headers = [{"Nats-Msg-Id": f"result:{b['job_id']}:1"} for b in bodies]

    def parse(i: int) -> object:
        return parse_envelope(datas[i], headers[i], 1 << 20)

    reference = rate(python.is_valid, bodies)
    figure = rate(native.is_valid, bodies)
    whole = rate(parse, list(range(n)))
    said = f"{n:,} answers ({valid:,} valid), is_valid"
    report.add(
        "contracts.jsonschema",
        SECTION,
        f"{said}: jsonschema {version('jsonschema')} (Python), answers/s",
        reference,
        "/s",
        short="jsonschema",
    )
    report.add(
        "contracts.jsonschema_rs",
        SECTION,
        f"{said}: jsonschema-rs {version('jsonschema-rs')} (the runtime's), answers/s",
        figure,
        "/s",
        ref="contracts.jsonschema",
        short="jsonschema-rs",
    )
    report.add(
        "contracts.parse",
        SECTION,
        "    parse_envelope (JSON, version, schema, storable): the inbox's whole check, /s",
        whole,
        "/s",
        ref="contracts.jsonschema_rs",
    )
