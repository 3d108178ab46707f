"""The bridge's schedule (S-TO-1), the app's health with NATS on and off (S-NATS-1,
S-NATS-3) and NATS authentication with an nkey seed (R-NATS-1)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import nkeys
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arm_core.bridge.nats_client import auth_options
from arm_core.config import Settings
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.services import envelope, send
from arm_core.devtools.testbed.sql import (
    API_LOGIN,
    SERVE_LOGIN,
    ack,
    as_login,
    dict_conn,
    job,
    one_row,
    publish,
    stored_file,
    upload,
)
from arm_core.runtime import BRIDGE, create_app
from arm_core.version import installed
from tests.support.bridge import LOOPS, fast_settings, running_bridge
from tests.support.natsauth import operator_mode

pytestmark = pytest.mark.integration


async def test_S_TO_1_processing_job_past_its_deadline_times_out(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    """S-TO-1: the bridge's schedule runs the sweep; a processing job past its
    reply_deadline becomes timeout with TIMEOUT, its file ERROR."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn, tabular_timeout=1)
        ack(conn, up.job_id, up.file_id)
    settings = fast_settings(db_url, nats_server.url(), timeout_sweep_seconds=1)  # given: explicit
    async with running_bridge(settings):
        with dict_conn(db_url) as conn:
            await wait_for(lambda: job(conn, up.job_id)["status"] == "timeout", 10)
            row = job(conn, up.job_id)
            task = one_row(conn, "SELECT * FROM arm.periodic_task WHERE name = 'sweep_timeouts'")
            assert stored_file(conn, up.file_id)["status"] == "ERROR"
    assert row["error_code"] == "TIMEOUT" and row["finished_at"] > row["reply_deadline"]
    assert task["run_every"].total_seconds() == 1  # TIMEOUT_SWEEP_SECONDS reached the table
    assert task["run_count"] >= 1


async def test_the_default_sweep_period_is_30_s(db_url: str) -> None:
    """S-TO-1 says within 30 s: that is the period the schedule ships with."""
    with dict_conn(db_url) as conn:
        task = one_row(conn, "SELECT * FROM arm.periodic_task WHERE name = 'sweep_timeouts'")
    assert task["run_every"].total_seconds() == 30 and task["enabled"]


@asynccontextmanager
async def api(settings: Settings) -> AsyncIterator[tuple[TestClient, web.Application]]:
    app = create_app(settings)
    async with TestClient(TestServer(app)) as http:
        yield http, app


async def test_S_NATS_1_debug_without_credentials_against_plain_nats(
    db_url: str, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """S-NATS-1: DEBUG, NATS_ENABLED, empty credentials, no JetStream → subscription
    active, /healthcheck nats = ok, no connection errors in the logs."""
    caplog.set_level(logging.DEBUG)
    env = {
        "DATABASE_URL": as_login(db_url, SERVE_LOGIN),  # API and bridge in one process
        "NATS_URL": nats_server.url(),
        "DEBUG": "true",
        "NATS_ENABLED": "true",
        "OPENBAO__NATS__NATS_SEED": "",
        "OPENBAO__NATS__NATS_JWT": "",
    }
    settings = Settings.from_env(env)
    assert "-js" not in nats_server.extra_args
    async with api(settings) as (http, app):

        async def healthy() -> bool:
            resp = await http.get("/healthcheck")
            return resp.status == 200 and (await resp.json())["nats"] == "ok"

        await wait_for(healthy, 10, "nats = ok")
        body = await (await http.get("/healthcheck")).json()
        assert body == {
            "status": "ok",
            "db": "ok",
            "nats": "ok",
            "outbox": "ok",
            "version": installed(),
        }
        bridge = app[BRIDGE]
        assert bridge.subscription is not None
        assert bridge.subscription.subject == "files.tabular_parsed"
        assert bridge.subscription.queue == "arm-core"
        # The subscription is live: an ack published now is applied.
        with dict_conn(db_url) as conn:
            up = upload(conn)
            await wait_for(lambda: job(conn, up.job_id)["status"] == "published", 10)
            client = await nats.connect(nats_server.url())
            await send(client, envelope(up.job_id, up.file_id, "processing"), f"ack:{up.job_id}:1")
            await client.close()
            await wait_for(lambda: job(conn, up.job_id)["status"] == "processing", 10)
    problems = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith(("arm_core", "nats"))
    ]
    assert problems == [], [r.getMessage() for r in problems]


async def test_S_NATS_3_nats_disabled_starts_without_background_tasks(db_url: str) -> None:
    """S-NATS-3: NATS_ENABLED=false → the app starts, no bridge tasks, /healthcheck 200
    with nats = off (and no NATS server exists at all here)."""
    settings = Settings.from_env(
        {
            "DATABASE_URL": as_login(db_url, API_LOGIN),
            "NATS_ENABLED": "false",
            "NATS_URL": "nats://127.0.0.1:9",
        }
    )
    async with api(settings) as (http, app):
        resp = await http.get("/healthcheck")
        assert resp.status == 200
        assert await resp.json() == {
            "status": "ok",
            "db": "ok",
            "nats": "off",
            "outbox": "ok",
            "version": installed(),
        }
        assert BRIDGE not in app
        running = {t.get_name() for t in asyncio.all_tasks()}
        assert not running & set(LOOPS)


async def test_healthcheck_reports_nats_unreachable(db_url: str, nats_server: EmbeddedNats) -> None:
    settings = fast_settings(as_login(db_url, SERVE_LOGIN), nats_server.url())
    async with api(settings) as (http, _app):

        async def nats_is(state: str) -> bool:
            return (await (await http.get("/healthcheck")).json())["nats"] == state

        await wait_for(lambda: nats_is("ok"), 10)
        nats_server.stop()
        await wait_for(lambda: nats_is("reconnecting"), 10)
        resp = await http.get("/healthcheck")
        assert resp.status == 200  # still serving: the API works without NATS
        assert (await resp.json())["status"] == "degraded"


def _nkey_server(tmp_path: Path) -> tuple[EmbeddedNats, str]:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(seed).public_key.decode()
    conf = tmp_path / "auth.conf"
    conf.write_text(f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}\n')
    server = EmbeddedNats(extra_args=["-c", str(conf)], log_dir=tmp_path / "nats").start()
    return server, seed.decode()


async def test_R_NATS_1_nkey_seed_connects_and_no_credentials_are_refused(
    db_url: str, tmp_path: Path
) -> None:
    server, seed = _nkey_server(tmp_path)
    try:
        with_seed = fast_settings(db_url, server.url(), nats_seed=seed)
        assert set(auth_options(with_seed)) == {"nkeys_seed_str"}
        async with running_bridge(with_seed) as bridge:
            assert bridge.nats_state() == "ok"

        without = fast_settings(db_url, server.url())
        assert auth_options(without) == {}
        with pytest.raises(nats.errors.Error, match=r"[Aa]uthorization"):
            await nats.connect(server.url(), allow_reconnect=False, **auth_options(without))
        wrong = fast_settings(
            db_url,
            server.url(),
            nats_seed=nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode(),
        )
        with pytest.raises(nats.errors.Error, match=r"[Aa]uthorization"):
            await nats.connect(server.url(), allow_reconnect=False, **auth_options(wrong))
    finally:
        server.stop()


async def test_R_NATS_1_user_jwt_with_seed_against_an_operator_mode_server(
    db_url: str, tmp_path: Path
) -> None:
    """Seed + JWT → JWT auth against a real nats-server in operator mode: the bridge
    connects and subscribes; the seed alone is refused."""
    creds = operator_mode()
    server = EmbeddedNats(
        extra_args=["-c", str(creds.write_config(tmp_path))], log_dir=tmp_path / "nats"
    ).start()
    try:
        settings = fast_settings(
            db_url, server.url(), nats_seed=creds.user_seed, nats_jwt=creds.user_jwt
        )
        assert set(auth_options(settings)) == {"user_jwt_cb", "signature_cb"}
        async with running_bridge(settings) as bridge:
            assert bridge.nats_state() == "ok"
        seed_only = fast_settings(db_url, server.url(), nats_seed=creds.user_seed)
        with pytest.raises(nats.errors.Error, match=r"[Aa]uthorization"):
            await nats.connect(server.url(), allow_reconnect=False, **auth_options(seed_only))
    finally:
        server.stop()


def test_bad_credentials_fail_at_start_naming_the_variable() -> None:
    from arm_core.config_error import ConfigError

    with pytest.raises(ConfigError, match=r"^OPENBAO__NATS__NATS_SEED: not a valid nkey seed"):
        auth_options(Settings(nats_seed="SUXXX"))
    with pytest.raises(ConfigError, match=r"^OPENBAO__NATS__NATS_SEED: required"):
        auth_options(Settings(nats_jwt="eyJ"))
