"""The OpenAPI document the app serves matches what the app does: every documented
route and status code is produced by the running app (database up, down, auth on),
each body validates against its documented schema, and every route is documented."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import pytest
from aiohttp.test_utils import TestClient
from jsonschema_rs import Draft202012Validator

from arm_core.access import ApiToken, Level
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.sql import dict_conn, fail_by_no_ack, publish, upload
from arm_core.http.app import OPENAPI_PATH
from arm_core.runtime import create_app
from tests.support.api import api_settings, running_api
from tests.support.fault_points import armed

pytestmark = pytest.mark.integration

TOKEN = "t0ken-for-the-contract-test"
VIEWER = "v1ewer-t0ken-for-the-contract-test"
METRICS = "metr1cs-t0ken-for-the-contract-test"


@dataclass
class Apps:
    up: TestClient  # database up, no auth
    auth: TestClient  # AUTH_MODE=token
    levels: TestClient  # AUTH_MODE=token with a viewer's and a metrics token (403s)
    down: TestClient  # database unreachable
    dead: TestClient  # a bridge whose connecting loop crashed past its restart limit
    failed_file: uuid.UUID
    live_file: uuid.UUID


@pytest.fixture
async def apps(db_url: str, pg_server: EmbeddedPostgres) -> AsyncIterator[Apps]:
    with dict_conn(db_url) as conn:
        conn.execute("SELECT arm.sample_status()")  # the charts' series: two samples, waits
        conn.execute("UPDATE arm.status_sample SET sampled_at = sampled_at - interval '1 minute'")
        failed = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
        live = upload(conn)
        conn.execute("SELECT arm.record_waits('queued', %s)", ([3] + [0] * 16,))
        conn.execute("SELECT arm.sample_status()")
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    down_url = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    proxy.block()
    auth = api_settings(db_url, auth_mode="token", api_tokens=(("contract", TOKEN),))
    levels = api_settings(
        db_url,
        auth_mode="token",
        api_tokens=(
            ApiToken("ivanova", VIEWER, Level.VIEWER),
            ApiToken("prometheus", METRICS, Level.METRICS),
        ),
    )
    dead_settings = api_settings(
        db_url,
        nats_enabled=True,
        nats_urls=("nats://127.0.0.1:1",),
        service_restart_limit=0,
    )
    try:
        # Its connecting loop raises at once, every time: the app's /livez says 503.
        with armed(("connect", -1)):
            async with (
                running_api(api_settings(db_url)) as up,
                running_api(auth) as auth_app,
                running_api(levels) as levels_app,
                running_api(api_settings(down_url, db_pool_timeout_seconds=0.5)) as down,
                running_api(dead_settings) as dead,
            ):
                yield Apps(up, auth_app, levels_app, down, dead, failed.file_id, live.file_id)
    finally:
        await proxy.close()


Recipe = Callable[[Apps], Awaitable[Any]]
F = "/api/v1/files/{file_id}"
R = "/api/v1/files/{file_id}/retry"
B = "/api/v1/files/retry"
L = "/api/v1/files"
S = "/api/v1/status/series"

# A viewer may read but not retry; a metrics token may read /metrics only.
AS_VIEWER = {"Authorization": f"Bearer {VIEWER}"}
AS_METRICS = {"Authorization": f"Bearer {METRICS}"}

RECIPES: dict[tuple[str, str, str], Recipe] = {
    ("/healthcheck", "get", "200"): lambda a: a.up.get("/healthcheck"),
    ("/healthcheck", "get", "503"): lambda a: a.down.get("/healthcheck"),
    ("/livez", "get", "200"): lambda a: a.up.get("/livez"),
    ("/livez", "get", "503"): lambda a: dead(a),
    ("/readyz", "get", "200"): lambda a: a.up.get("/readyz"),
    ("/readyz", "get", "503"): lambda a: a.down.get("/readyz"),
    ("/api/v1/openapi.json", "get", "200"): lambda a: a.up.get("/api/v1/openapi.json"),
    ("/api/v1/whoami", "get", "200"): lambda a: a.auth.get("/api/v1/whoami"),
    ("/api/v1/status", "get", "200"): lambda a: a.up.get("/api/v1/status"),
    ("/api/v1/status", "get", "401"): lambda a: a.auth.get("/api/v1/status"),
    ("/api/v1/status", "get", "503"): lambda a: a.down.get("/api/v1/status"),
    (S, "get", "200"): lambda a: a.up.get(S),
    (S, "get", "400"): lambda a: a.up.get(S, params={"minutes": "0"}),
    (S, "get", "401"): lambda a: a.auth.get(S),
    (S, "get", "503"): lambda a: a.down.get(S),
    (R, "post", "201"): lambda a: a.up.post(f"/api/v1/files/{a.failed_file}/retry"),
    (R, "post", "400"): lambda a: a.up.post("/api/v1/files/x/retry"),
    (R, "post", "401"): lambda a: a.auth.post(f"/api/v1/files/{a.failed_file}/retry"),
    (R, "post", "404"): lambda a: a.up.post(f"/api/v1/files/{uuid.uuid4()}/retry"),
    (R, "post", "409"): lambda a: a.up.post(f"/api/v1/files/{a.live_file}/retry"),
    (R, "post", "503"): lambda a: a.down.post(f"/api/v1/files/{a.failed_file}/retry"),
    (B, "post", "200"): lambda a: a.up.post(B, json={"file_ids": [str(a.live_file)]}),
    (B, "post", "400"): lambda a: a.up.post(B, json={"file_ids": "x"}),
    (B, "post", "401"): lambda a: a.auth.post(B, json={"file_ids": [str(a.live_file)]}),
    (B, "post", "413"): lambda a: a.up.post(B, json={"file_ids": [str(uuid.uuid4())] * 1001}),
    (B, "post", "415"): lambda a: a.up.post(B, data="x", headers={"Content-Type": "text/plain"}),
    (B, "post", "503"): lambda a: a.down.post(B, json={"file_ids": [str(a.live_file)]}),
    (F, "get", "200"): lambda a: a.up.get(f"/api/v1/files/{a.failed_file}"),
    (F, "get", "400"): lambda a: a.up.get("/api/v1/files/x"),
    (F, "get", "401"): lambda a: a.auth.get(f"/api/v1/files/{a.failed_file}"),
    (F, "get", "404"): lambda a: a.up.get(f"/api/v1/files/{uuid.uuid4()}"),
    (F, "get", "503"): lambda a: a.down.get(f"/api/v1/files/{a.failed_file}"),
    (L, "get", "200"): lambda a: a.up.get(L, params={"status": "ERROR", "limit": "1"}),
    (L, "get", "400"): lambda a: a.up.get(L, params={"cursor": "not-ours"}),
    (L, "get", "401"): lambda a: a.auth.get(L),
    (L, "get", "503"): lambda a: a.down.get(L),
    ("/api/v1/status", "get", "403"): lambda a: a.levels.get("/api/v1/status", headers=AS_METRICS),
    (S, "get", "403"): lambda a: a.levels.get(S, headers=AS_METRICS),
    (F, "get", "403"): lambda a: a.levels.get(f"/api/v1/files/{a.failed_file}", headers=AS_METRICS),
    (L, "get", "403"): lambda a: a.levels.get(L, headers=AS_METRICS),
    (R, "post", "403"): lambda a: a.levels.post(
        f"/api/v1/files/{a.failed_file}/retry", headers=AS_VIEWER
    ),
    (B, "post", "403"): lambda a: a.levels.post(
        B, json={"file_ids": [str(a.failed_file)]}, headers=AS_VIEWER
    ),
}


async def dead(apps: Apps) -> Any:
    """/livez of the app whose bridge gave up (at once: SERVICE_RESTART_LIMIT=0)."""
    await wait_for(lambda: _status(apps.dead.get("/livez"), 503), 10, "the bridge's loop failed")
    return await apps.dead.get("/livez")


async def _status(request: Awaitable[Any], status: int) -> bool:
    return bool((await request).status == status)


def documented(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (path, method, status)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        for status in op["responses"]
    }


def response_validator(
    doc: dict[str, Any], path: str, method: str, status: str
) -> Draft202012Validator:
    schema = doc["paths"][path][method]["responses"][status]["content"]["application/json"][
        "schema"
    ]
    root = {"components": doc["components"], **schema}
    return Draft202012Validator(root, validate_formats=True)


async def test_every_documented_route_and_status_is_what_the_app_does(apps: Apps) -> None:
    doc = await (await apps.up.get("/api/v1/openapi.json")).json()
    jsonschema_rs.meta.validate({"$defs": doc["components"]["schemas"]})
    assert documented(doc) == set(RECIPES), "document and recipes disagree"
    for (path, method, status), recipe in sorted(RECIPES.items()):
        resp = await recipe(apps)
        assert str(resp.status) == status, (path, method, status, await resp.text())
        body = await resp.json()
        errors = sorted(
            e.message for e in response_validator(doc, path, method, status).iter_errors(body)
        )
        assert errors == [], (path, method, status, body)


def test_every_route_of_the_app_is_documented() -> None:
    import json

    doc = json.loads(OPENAPI_PATH.read_text())
    app = create_app(api_settings("postgresql://unused@127.0.0.1:1/x"))
    served = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.resource is not None
        and route.method != "HEAD"
        # The operator console's page and static files (text/html, css, js) are not API;
        # /metrics is Prometheus text (docs/logs-and-metrics.md "Metrics").
        and route.resource.canonical not in ("/", "/console/{name}", "/metrics")
    }
    in_doc = {(path, method) for path, method, _ in documented(doc)}
    assert served == in_doc
