"""Sessions that idle in a transaction end themselves: every connection of the
process's pool sets idle_in_transaction_session_timeout
(DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS, shortened here), so the server ends one
left idle inside a transaction — as a process whose network path went silent leaves
it — and the pool replaces it. A DATABASE_URL that sets the timeout itself keeps it, its
other options are kept beside ours, 0 leaves the server's setting, and the bridge's
LISTEN connection (not from the pool) and migrate's own session get the setting too."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from arm_core import migrate
from arm_core.config import Settings
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.sql import dict_conn, scalar
from arm_core.runtime import make_pool
from arm_core.store import Store
from tests.support.bridge import fast_settings, new_bridge
from tests.support.steps import NO_NATS

pytestmark = pytest.mark.integration


def settings(url: str, idle: float) -> Settings:
    return Settings(
        database_url=url,
        nats_enabled=False,
        db_pool_max_size=1,
        db_idle_in_transaction_timeout_seconds=idle,
    )


async def test_a_pooled_session_left_idle_in_a_transaction_is_ended_and_replaced(
    db_url: str, bridge_db_url: str
) -> None:
    pool = make_pool(settings(bridge_db_url, 0.5))
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            row = await (await conn.execute("SHOW idle_in_transaction_session_timeout")).fetchone()
            assert row is not None and row[0] == "500ms"
            await conn.execute("BEGIN")
            row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
            assert row is not None
            pid = row[0]
            with dict_conn(db_url) as watcher:
                await wait_for(
                    lambda: (
                        scalar(
                            watcher, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
                        )
                        == 0
                    ),
                    10,
                    "the server ended the session idle in its transaction",
                )
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                await conn.execute("SELECT 1")
        # The pool gave the broken connection up and made another: the next call works.
        assert await Store(pool).outbox_ready_age() == 0
    finally:
        await pool.close()


@pytest.mark.parametrize("idle", [0.5, 0])
async def test_a_database_url_that_sets_the_timeout_keeps_it(
    bridge_db_url: str, idle: float
) -> None:
    own = make_conninfo(
        bridge_db_url, options="-c idle_in_transaction_session_timeout=7s -c work_mem=2MB"
    )
    pool = make_pool(settings(own, idle))
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            for name, value in (("idle_in_transaction_session_timeout", "7s"), ("work_mem", "2MB")):
                row = await (await conn.execute(f"SHOW {name}")).fetchone()
                assert row is not None and row[0] == value, name
    finally:
        await pool.close()


async def test_the_urls_other_options_are_kept_beside_the_timeout(bridge_db_url: str) -> None:
    pool = make_pool(settings(make_conninfo(bridge_db_url, options="-c work_mem=2MB"), 0.5))
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            for name, value in (
                ("idle_in_transaction_session_timeout", "500ms"),
                ("work_mem", "2MB"),
            ):
                row = await (await conn.execute(f"SHOW {name}")).fetchone()
                assert row is not None and row[0] == value, name
    finally:
        await pool.close()


async def test_0_leaves_the_servers_setting(bridge_db_url: str) -> None:
    pool = make_pool(settings(bridge_db_url, 0))
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            row = await (await conn.execute("SHOW idle_in_transaction_session_timeout")).fetchone()
            assert row is not None and row[0] == "0"  # the suite's server sets none
    finally:
        await pool.close()


async def test_the_listen_connection_of_a_bridge_gets_the_timeout_too(bridge_db_url: str) -> None:
    """The bridge's LISTEN session is not from the pool: its own connection string
    carries the setting (DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS of the bridge's
    settings), as the server sees it."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(bridge_db_url, open=False)
    values = {"db_idle_in_transaction_timeout_seconds": 45.0, "nats_enabled": True}
    bridge = new_bridge(fast_settings(bridge_db_url, NO_NATS, **values), pool)
    async with await psycopg.AsyncConnection.connect(bridge.listener.conninfo()) as conn:
        row = await (await conn.execute("SHOW idle_in_transaction_session_timeout")).fetchone()
        assert row is not None and row[0] == "45s"


def test_migrates_own_session_gets_the_timeout(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """migrate holds its session (and the advisory lock) for the whole migration: the
    server ends it, and frees the lock, if its client goes silent inside a transaction.
    Read on that session while it migrates (when it writes the settings)."""
    seen: list[str] = []
    apply_settings = migrate.apply_settings

    def reading(conn: psycopg.Connection, s: Settings) -> None:
        row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        seen.append(row[0] if row else "")
        apply_settings(conn, s)

    monkeypatch.setattr(migrate, "apply_settings", reading)
    migrate.migrate(
        db_url, Settings(database_url=db_url, db_idle_in_transaction_timeout_seconds=45)
    )
    assert seen == ["45s"]
