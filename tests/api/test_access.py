"""Who may do what over HTTP, against a real `arm-core serve` process (AUTH_MODE=token)
and, for header mode with groups, the real app: a table of caller × endpoint × the
status it gets, like the database roles' table test. A viewer reads, an operator also
retries, a metrics token reads /metrics only, a token without a level does everything
(as before levels existed); without credentials 401, with a level that does not grant
the request 403 FORBIDDEN naming the level needed. A refused retry changes nothing; an
allowed one records the actor and its level in the retry audit."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict

from arm_core.access import ApiToken, Level
from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.processes import ArmProcess, serve_env
from arm_core.devtools.testbed.sql import dict_conn, fail_by_no_ack, publish, scalar, upload
from arm_core.http.auth import warn_unlevelled_tokens
from tests.support.api import api_settings, running_api

pytestmark = pytest.mark.integration

TOKENS = {
    "viewer": "viewer-t0ken-0123456789",
    "operator": "operator-t0ken-0123456789",
    "metrics": "metrics-t0ken-0123456789",
    "legacy": "legacy-t0ken-0123456789",  # no level: every level, for one release
}
API_TOKENS = ",".join(
    [
        f"ivanova:viewer={TOKENS['viewer']}",
        f"petrov:operator={TOKENS['operator']}",
        f"prometheus:metrics={TOKENS['metrics']}",
        f"old-script={TOKENS['legacy']}",
    ]
)
ACTORS = {
    "viewer": "ivanova",
    "operator": "petrov",
    "metrics": "prometheus",
    "legacy": "old-script",
}
CALLERS = ("nobody", "wrong", "viewer", "operator", "metrics", "legacy")

# What each caller gets: 401 without (valid) credentials; 403 for a level that does not
# grant the request. Retries answer 201 (one file) and 200 (a batch) when allowed.
READ = {"nobody": 401, "wrong": 401, "viewer": 200, "operator": 200, "metrics": 403, "legacy": 200}
RETRY_ONE = {**READ, "viewer": 403, "operator": 201, "legacy": 201}
RETRY_MANY = {**RETRY_ONE, "operator": 200, "legacy": 200}
METRICS = {**READ, "viewer": 403, "operator": 403, "metrics": 200}
OPEN = dict.fromkeys(CALLERS, 200)
# The level a 403 names.
NEEDED = {"read": "viewer", "retry": "operator", "metrics": "metrics"}


@dataclass
class Served:
    base: str
    db_url: str
    log: Path


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[Served]:
    port = free_port()
    env = serve_env(db_url, port, AUTH_MODE="token", API_TOKENS=API_TOKENS)
    proc = ArmProcess("serve", env, tmp_path / "serve.log")
    try:
        proc.wait_healthy(port)
        yield Served(f"http://127.0.0.1:{port}", db_url, tmp_path / "serve.log")
        assert proc.stop() == 0
    finally:
        if proc.proc.poll() is None:
            proc.kill()


def call(base: str, method: str, path: str, caller: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if caller == "wrong":
        headers["Authorization"] = "Bearer not-a-configured-token-000"
    elif caller != "nobody":
        headers["Authorization"] = f"Bearer {TOKENS[caller]}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            status, raw, kind = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    return status, json.loads(raw) if kind.startswith("application/json") else raw.decode()


def failed_file(db_url: str) -> uuid.UUID:
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
    return up.file_id


def history(db_url: str, file_id: uuid.UUID) -> tuple[Any, ...]:
    """What a retry would change: the file's current job and its audit rows."""
    with dict_conn(db_url) as conn:
        current = scalar(
            conn, "SELECT current_recognition_job_id FROM arm.stored_file WHERE id = %s", (file_id,)
        )
        audit = scalar(conn, "SELECT count(*) FROM arm.retry_audit WHERE file_id = %s", (file_id,))
    return current, audit


def audit_of(db_url: str, file_id: uuid.UUID) -> tuple[str, str]:
    with dict_conn(db_url) as conn:
        row = conn.execute(
            "SELECT actor, actor_level FROM arm.retry_audit WHERE file_id = %s", (file_id,)
        ).fetchone()
    assert row is not None
    return row["actor"], row["actor_level"]


def check_refusal(status: int, body: Any, caller: str, permission: str) -> None:
    """A 401 or 403 is JSON, and a 403 names the level needed and the caller's."""
    error = body["error"]
    if status == 401:
        assert error["code"] == "UNAUTHORIZED", body
        return
    assert error["code"] == "FORBIDDEN", body
    assert error["details"]["needed"] == NEEDED[permission], body
    assert error["details"]["levels"] == [caller], body  # the one level its token names
    assert f"needs the {NEEDED[permission]} level" in error["message"], body
    assert ACTORS[caller] in error["message"] and TOKENS[caller] not in error["message"], body


@pytest.mark.parametrize("caller", CALLERS)
def test_each_caller_gets_what_its_level_grants_on_every_endpoint(
    served: Served, caller: str
) -> None:
    base, db_url = served.base, served.db_url
    some_file = failed_file(db_url)
    reads = [
        "/api/v1/files",
        f"/api/v1/files/{some_file}",
        "/api/v1/status",
        "/api/v1/status/series",
    ]
    for path in reads:
        status, body = call(base, "GET", path, caller)
        assert status == READ[caller], (path, caller, body)
        if status >= 400:
            check_refusal(status, body, caller, "read")

    for path in (
        "/healthcheck",
        "/livez",
        "/readyz",
        "/api/v1/whoami",
        "/api/v1/openapi.json",
        "/",
    ):
        status, body = call(base, "GET", path, caller)
        assert status == OPEN[caller], (path, caller, body)

    status, body = call(base, "GET", "/metrics", caller)
    assert status == METRICS[caller], (caller, body)
    if status == 200:
        assert "arm_http_requests_total" in str(body) or "# TYPE" in str(body)
    else:
        check_refusal(status, body, caller, "metrics")

    one = failed_file(db_url)
    before = history(db_url, one)
    status, body = call(base, "POST", f"/api/v1/files/{one}/retry", caller)
    assert status == RETRY_ONE[caller], (caller, body)
    if status == 201:
        level = "all" if caller == "legacy" else "operator"
        assert audit_of(db_url, one) == (ACTORS[caller], level)
    else:
        check_refusal(status, body, caller, "retry")
        assert history(db_url, one) == before, "a refused retry changed nothing"

    many = [failed_file(db_url), failed_file(db_url)]
    before_many = [history(db_url, f) for f in many]
    body_in = {"file_ids": [str(f) for f in many]}
    status, body = call(base, "POST", "/api/v1/files/retry", caller, body_in)
    assert status == RETRY_MANY[caller], (caller, body)
    if status == 200:
        assert [r["outcome"] for r in body["results"]] == ["retried", "retried"], body
    else:
        check_refusal(status, body, caller, "retry")
        assert [history(db_url, f) for f in many] == before_many


@pytest.mark.parametrize(
    ("caller", "expected"),
    [
        ("nobody", {"actor": None, "level": None, "levels": []}),
        ("viewer", {"actor": "ivanova", "level": "viewer", "levels": ["viewer"]}),
        ("operator", {"actor": "petrov", "level": "operator", "levels": ["operator"]}),
        ("metrics", {"actor": "prometheus", "level": "metrics", "levels": ["metrics"]}),
        (
            "legacy",
            {
                "actor": "old-script",
                "level": "operator",
                "levels": ["metrics", "operator", "viewer"],
            },
        ),
    ],
)
def test_whoami_names_the_level(served: Served, caller: str, expected: dict[str, Any]) -> None:
    status, body = call(served.base, "GET", "/api/v1/whoami", caller)
    assert status == 200
    assert body == {**expected, "auth_mode": "token"}


def test_the_start_logs_the_tokens_without_a_level_once_and_no_token(served: Served) -> None:
    lines = [line for line in served.log.read_text().splitlines() if "no access level" in line]
    assert len(lines) == 1, lines
    assert "old-script" in lines[0] and "1 of 4 entries" in lines[0]
    assert not any(token in served.log.read_text() for token in TOKENS.values())


def test_no_warning_when_every_token_names_its_level(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = api_settings(
        db_url, auth_mode="token", api_tokens=(ApiToken("ivanova", TOKENS["viewer"], Level.VIEWER),)
    )
    with caplog.at_level(logging.WARNING):
        warn_unlevelled_tokens(settings)
    assert not caplog.records


GROUPS = {
    "auth_mode": "header",
    "auth_groups_header": "X-Forwarded-Groups",
    "auth_operator_groups": frozenset({"arm-operators"}),
    "auth_viewer_groups": frozenset({"arm-support", "auditors"}),
    "auth_metrics_groups": frozenset({"monitoring"}),
}


@pytest.mark.parametrize(
    ("groups", "read", "retry", "metrics", "levels"),
    [
        ("arm-operators", 200, 201, 403, ["operator"]),
        ("auditors", 200, 403, 403, ["viewer"]),
        (" other , arm-support ", 200, 403, 403, ["viewer"]),
        ("arm-support,arm-operators", 200, 201, 403, ["operator", "viewer"]),
        ("monitoring", 403, 403, 200, ["metrics"]),
        ("other", 403, 403, 403, []),
        ("", 403, 403, 403, []),
        (None, 403, 403, 403, []),  # no groups header at all
        (["staff", "arm-operators"], 200, 201, 403, ["operator"]),  # a line per group
    ],
)
async def test_header_mode_grants_by_the_proxys_groups(
    db_url: str,
    groups: str | list[str] | None,
    read: int,
    retry: int,
    metrics: int,
    levels: list[str],
) -> None:
    file_id = failed_file(db_url)
    headers = CIMultiDict({"X-Forwarded-User": "sidorova@corp"})
    for line in [groups] if isinstance(groups, str) else groups or []:
        headers.add("X-Forwarded-Groups", line)
    async with running_api(api_settings(db_url, **GROUPS)) as http:
        resp = await http.get(f"/api/v1/files/{file_id}", headers=headers)
        assert resp.status == read, await resp.text()
        before = history(db_url, file_id)
        resp = await http.post(f"/api/v1/files/{file_id}/retry", headers=headers)
        assert resp.status == retry, await resp.text()
        if retry == 403:
            assert (await resp.json())["error"]["code"] == "FORBIDDEN"
            assert history(db_url, file_id) == before
        else:
            assert audit_of(db_url, file_id) == ("sidorova@corp", "operator")
        resp = await http.get("/metrics", headers=headers)
        assert resp.status == metrics, await resp.text()
        me = await (await http.get("/api/v1/whoami", headers=headers)).json()
        assert me["actor"] == "sidorova@corp" and me["levels"] == levels
        # Groups without an identity are no credentials.
        resp = await http.get("/api/v1/files", headers={"X-Forwarded-Groups": "arm-operators"})
        assert resp.status == 401


@pytest.mark.parametrize(
    ("metrics_auth", "caller", "expected"),
    [
        ("any", "viewer", 200),
        ("any", "operator", 200),
        ("any", "metrics", 200),
        ("any", "nobody", 401),
        ("none", "nobody", 200),
        ("level", "viewer", 403),
    ],
)
async def test_metrics_auth_says_what_metrics_asks(
    db_url: str, metrics_auth: str, caller: str, expected: int
) -> None:
    tokens = tuple(
        ApiToken(actor, TOKENS[level], Level(level))
        for level, actor in ACTORS.items()
        if level != "legacy"
    )
    settings = api_settings(db_url, auth_mode="token", api_tokens=tokens, metrics_auth=metrics_auth)
    headers = {} if caller == "nobody" else {"Authorization": f"Bearer {TOKENS[caller]}"}
    async with running_api(settings) as http:
        resp = await http.get("/metrics", headers=headers)
        assert resp.status == expected, await resp.text()
