"""What a failover asks of the connections, on the suite's PostgreSQL: a pooled
connection whose server turned read-only is not handed out again, one that met a
read-only error is closed (so the pool connects anew, which a multi-host URL with
target_session_attrs=read-write sends to the writable host), and `arm-core migrate`
takes libpq's key=value form as it takes a URL. The failover itself, a primary killed
and its standby promoted under a flow: tests/e2e/test_pg_failover.py."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from arm_core.config import Settings
from arm_core.db import DatabaseUnavailable
from arm_core.migrate import migrate
from arm_core.runtime import make_pool
from arm_core.store import Store


async def backend_pid(pool: AsyncConnectionPool) -> int:
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_connection_whose_server_turned_read_only_is_not_handed_out(
    db_url: str,
) -> None:
    """The server reports in_hot_standby and default_transaction_read_only on its own
    (PostgreSQL 14+): the pool's check reads them without a round trip."""
    pool = make_pool(Settings(database_url=db_url, nats_enabled=False, db_pool_max_size=1))
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            first = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
            # What a demoted server tells its sessions (a standby says in_hot_standby).
            await conn.execute("SET default_transaction_read_only = on")
        second = await backend_pid(pool)
        assert second != first  # discarded when taken, a new one made
        store = Store(pool)
        result = await store.retry_file(uuid.uuid4(), "ops")  # a write path, writable
        assert result.outcome == "not_found"
    finally:
        await pool.close()


async def test_a_connection_that_met_a_read_only_error_is_closed(db_url: str) -> None:
    """Without the check (a server that turned read-only while the connection was out of
    the pool): the write fails as DatabaseUnavailable — try again later, the API's 503 —
    and the connection is closed, not reused."""
    read_only_url = make_conninfo(db_url, options="-c default_transaction_read_only=on")
    pool: AsyncConnectionPool = AsyncConnectionPool(
        read_only_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    try:
        before = await backend_pid(pool)
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            await Store(pool).retry_file(uuid.uuid4(), "ops")
        assert await backend_pid(pool) != before
    finally:
        await pool.close()


def test_migrate_takes_the_key_value_form(db_url: str) -> None:
    params = conninfo_to_dict(db_url)
    keywords = " ".join(f"{k}={v}" for k, v in params.items())
    assert "://" not in keywords
    report = migrate(keywords, Settings(database_url=keywords))
    assert report.applied_migrations == []  # already migrated: nothing to do, no error
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM arm.setting").fetchone() is not None
