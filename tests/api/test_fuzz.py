"""A property-based run over the OpenAPI document: schemathesis
generates requests for every documented operation — valid ones and, as often, invalid
ones (wrong types, missing fields, bad ids, odd headers, methods the route does not
allow) — and sends them to a real `arm-core serve` on a real PostgreSQL. Every response
must be no 5xx, documented (status, content type, headers, body schema), and every error
JSON {"error": {"code", "message"}}.

Bounded and repeatable: per operation, schemathesis's coverage cases (boundary values,
every method the route does not allow) and at most EXAMPLES generated requests, valid
and invalid mixed; derandomized (the same requests every run), no example database, no
deadline (a real process answers). One server and one database for the whole run, about
ten seconds. A failure prints the request as a curl command.
"""

from __future__ import annotations

import datetime as dt
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.core.transport import Response

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.processes import ArmProcess, serve_env
from arm_core.devtools.testbed.sql import dict_conn, fail_by_no_ack, publish, upload
from arm_core.http.app import OPENAPI_PATH
from arm_core.http.file_list import encode_cursor
from tests.support.databases import clone

pytestmark = pytest.mark.integration

EXAMPLES = 50


@dataclass
class Served:
    base_url: str
    db_url: str
    failed_file: uuid.UUID
    live_file: uuid.UUID


@pytest.fixture(scope="module")
def served(
    pg_server: EmbeddedPostgres, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One database (a clone of the migrated template) and one `arm-core serve` for every
    operation's run: a failed file (retryable once) and a live one in it."""
    with clone(pg_server, "arm_fuzz", template_db) as db_url:
        yield from _served(db_url, tmp_path_factory)


def _served(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with dict_conn(db_url) as conn:
        failed = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
        live = upload(conn)
    port = free_port()
    proc = ArmProcess(
        "serve", serve_env(db_url, port), tmp_path_factory.mktemp("fuzz") / "serve.log"
    )
    try:
        proc.wait_healthy(port)
        yield Served(f"http://127.0.0.1:{port}", db_url, failed.file_id, live.file_id)
        assert proc.stop() == 0
        assert "Traceback" not in proc.log(), proc.log()[-3000:]
    finally:
        if proc.proc.poll() is None:
            proc.kill()


def errors_are_json(response: Response) -> None:
    if response.status_code < 400:
        return
    content_type = response.headers.get("content-type", [""])[0]
    assert content_type.startswith("application/json"), (response.status_code, content_type)
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert body["error"]["code"] and body["error"]["message"], body


schema = schemathesis.openapi.from_path(
    OPENAPI_PATH,
    config=schemathesis.Config.from_dict(
        {
            "generation": {
                "mode": "all",  # valid and invalid requests
                "max-examples": EXAMPLES,
                "deterministic": True,
                "database": "none",
            },
            # Invalid data is rejected with a documented 4xx: 413 is the document's answer
            # to more file ids than RETRY_BATCH_MAX (the schema's maxItems).
            "checks": {
                "negative_data_rejection": {"expected-statuses": [400, 401, 404, 405, 413, 415]}
            },
        }
    ),
)


def on_known_files(case: Any, served: Served) -> None:
    """Points two thirds of the valid requests that name a file at the database's files
    (chosen by the generated id, so the run stays repeatable): the answers about real
    rows — 201, 409 with its details, 200 with the file, a batch's retried and skipped
    entries — are checked against the document too, not only 404s. A valid id for a
    valid one: the request stays valid. A valid list request's cursor becomes a real one
    (a cursor is opaque: no schema tells a valid one)."""
    if case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE:
        return
    known = [str(served.failed_file), str(served.live_file)]
    query = case.query or {}
    if isinstance(query.get("cursor"), str):  # opaque: a valid one is one the API gave out
        query["cursor"] = encode_cursor(
            dt.datetime.now(dt.UTC), uuid.UUID(int=len(query["cursor"]))
        )
    params = case.path_parameters or {}
    if isinstance(params.get("file_id"), str):
        pick = zlib.crc32(params["file_id"].encode()) % 3
        if pick < len(known):
            params["file_id"] = known[pick]
    elif isinstance(case.body, dict) and case.body.get("file_ids"):
        ids = case.body["file_ids"]
        ids[0] = known[zlib.crc32(str(ids[0]).encode()) % len(known)]


@schema.parametrize()
# Health checks time data generation and filtering; none of that is what is tested here.
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_api(case: Any, served: Served) -> None:
    on_known_files(case, served)
    response = case.call_and_validate(base_url=served.base_url)
    errors_are_json(response)
