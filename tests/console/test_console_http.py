"""The console's shell as the server serves it: the page and its static files
with a strict Content-Security-Policy, no data without credentials, and
/api/v1/whoami for each AUTH_MODE. The browser tests are in test_console.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient

from arm_core.access import ApiToken, Level
from arm_core.http.app import CONSOLE_DIR
from tests.support.api import api_settings, running_api

pytestmark = pytest.mark.integration

TOKEN = "console-test-token-0123456789"  # no level: every level, as before levels existed
VIEWER = "console-test-viewer-0123456789"
METRICS = "console-test-metrics-0123456789"
EVERY = ["metrics", "operator", "viewer"]
NOBODY: dict[str, object] = {"actor": None, "level": None, "levels": []}  # no credentials


@pytest.fixture
async def token_app(db_url: str) -> AsyncIterator[TestClient]:
    tokens = (
        ApiToken("ops", TOKEN),
        ApiToken("ivanova", VIEWER, Level.VIEWER),
        ApiToken("prom", METRICS, Level.METRICS),
    )
    settings = api_settings(db_url, auth_mode="token", api_tokens=tokens)
    async with running_api(settings) as client:
        yield client


async def test_the_shell_loads_without_credentials_with_a_strict_csp(
    token_app: TestClient,
) -> None:
    page = await token_app.get("/")
    assert page.status == 200
    assert page.content_type == "text/html" and page.charset == "utf-8"
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "http" not in csp
    html = await page.text()
    assert "<script" in html and 'src="/console/' in html
    # No inline script or style: every <script> has a src and there is no <style>.
    assert html.count("<script") == html.count('<script type="module" src="/console/')
    assert "<style" not in html and " style=" not in html and " on" + "click=" not in html
    for path in sorted(p for p in CONSOLE_DIR.iterdir() if p.suffix in (".js", ".css", ".json")):
        resp = await token_app.get(f"/console/{path.name}")
        assert resp.status == 200, path.name
        assert resp.headers["Content-Security-Policy"] == csp
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert (await resp.read()) == path.read_bytes()
    # The console's texts (English and Russian), fetched by console.js at start.
    messages = await token_app.get("/console/messages.json")
    assert messages.content_type == "application/json" and messages.charset == "utf-8"
    assert messages.headers["Cache-Control"] == "no-cache"
    assert set(await messages.json()) == {"en", "ru"}


async def test_an_unknown_console_file_is_a_json_404(token_app: TestClient) -> None:
    for path in ("/console/nope.js", "/console/..%2fapp.py", "/console/"):
        resp = await token_app.get(path)
        assert resp.status == 404, path
        assert (await resp.json())["error"]["code"] == "NOT_FOUND"


async def whoami(client: TestClient, token: str) -> object:
    resp = await client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert resp.status == 200
    return await resp.json()


async def test_whoami_with_a_token(token_app: TestClient) -> None:
    """What the console goes by: who, the level it shows, and the levels that decide
    what it offers (a viewer no retry; a metrics token not the console at all)."""
    anon = await token_app.get("/api/v1/whoami")
    assert anon.status == 200
    assert await anon.json() == {**NOBODY, "auth_mode": "token"}
    assert await whoami(token_app, "wrong") == {**NOBODY, "auth_mode": "token"}
    assert await whoami(token_app, TOKEN) == {
        "actor": "ops",
        "level": "operator",
        "levels": EVERY,
        "auth_mode": "token",
    }
    assert await whoami(token_app, VIEWER) == {
        "actor": "ivanova",
        "level": "viewer",
        "levels": ["viewer"],
        "auth_mode": "token",
    }
    assert await whoami(token_app, METRICS) == {
        "actor": "prom",
        "level": "metrics",
        "levels": ["metrics"],
        "auth_mode": "token",
    }
    # The shell is public; the data is not.
    data = await token_app.get("/api/v1/files/00000000-0000-0000-0000-000000000000")
    assert data.status == 401


async def test_whoami_behind_a_proxy_and_without_auth(db_url: str) -> None:
    async with running_api(api_settings(db_url, auth_mode="header")) as proxy:
        resp = await proxy.get("/api/v1/whoami", headers={"X-Forwarded-User": "Анна"})
        assert await resp.json() == {
            "actor": "Анна",
            "level": "operator",
            "levels": EVERY,
            "auth_mode": "header",
        }
        resp = await proxy.get("/api/v1/whoami")
        assert await resp.json() == {**NOBODY, "auth_mode": "header"}
    grouped = api_settings(
        db_url,
        auth_mode="header",
        auth_groups_header="X-Forwarded-Groups",
        auth_operator_groups=frozenset({"arm-operators"}),
        auth_viewer_groups=frozenset({"arm-support"}),
    )
    async with running_api(grouped) as proxy:
        resp = await proxy.get(
            "/api/v1/whoami",
            headers={"X-Forwarded-User": "Анна", "X-Forwarded-Groups": "staff, arm-support"},
        )
        assert await resp.json() == {
            "actor": "Анна",
            "level": "viewer",
            "levels": ["viewer"],
            "auth_mode": "header",
        }
        # In none of the groups: signed in, with no level (the console says it may not view).
        resp = await proxy.get(
            "/api/v1/whoami", headers={"X-Forwarded-User": "Анна", "X-Forwarded-Groups": "staff"}
        )
        assert await resp.json() == {
            "actor": "Анна",
            "level": None,
            "levels": [],
            "auth_mode": "header",
        }
    async with running_api(api_settings(db_url)) as none:
        resp = await none.get("/api/v1/whoami")
        assert await resp.json() == {
            "actor": "anonymous",
            "level": "operator",
            "levels": EVERY,
            "auth_mode": "none",
        }
