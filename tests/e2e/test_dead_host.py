"""A database host that stops answering without closing its sockets — its machine lost,
a network cut — must not hang a process: a connection attempt gives up after
connect_timeout, a query after TCP's own deadlines (arm_core.db.CONNECTION_DEFAULTS:
keepalives on an idle connection, tcp_user_timeout while a query is unacknowledged),
and the caller gets DatabaseUnavailable (the API's 503, the inbox's hold) to retry.

A kill -9 on loopback resets the sockets, which any client notices at once: here the
host is made silent instead — a listener that accepts and never speaks, and iptables
dropping every packet to and from a running PostgreSQL's port (the test's own server;
the rules are removed at the end, whatever happens)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arm_core.config import Settings
from arm_core.db import CONNECTION_DEFAULTS, DatabaseUnavailable
from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.faults import RULE_COMMENT, black_hole, clear_black_holes
from arm_core.devtools.testbed.polling import wait_for
from arm_core.migrate import migrate
from arm_core.runtime import make_pool
from arm_core.store import Store

pytestmark = pytest.mark.e2e

CONNECT_TIMEOUT = float(CONNECTION_DEFAULTS["connect_timeout"])
# The query's deadlines through the URL, as an operator may give them: the same
# mechanism as the defaults (which tests/unit/test_db_outage.py checks are applied)
# at a sixth of their length, so the test waits 5 s instead of 30.
USER_TIMEOUT = float(CONNECTION_DEFAULTS["tcp_user_timeout"]) / 1000 / 6
SHORT_DEADLINES = (
    f"tcp_user_timeout={USER_TIMEOUT * 1000:.0f}&keepalives_idle=2&keepalives_interval=1"
)


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word."""
    server = socket.create_server(("127.0.0.1", 0), backlog=16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


async def test_a_connection_attempt_to_a_silent_host_gives_up(silent_listener: int) -> None:
    url = f"postgresql://arm@127.0.0.1:{silent_listener}/arm"
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match="timeout expired"):
        # A deadline of its own: without connect_timeout this would wait forever.
        await asyncio.wait_for(
            asyncio.to_thread(migrate, url, Settings(database_url=url)), CONNECT_TIMEOUT + 30
        )
    took = time.monotonic() - started
    assert CONNECT_TIMEOUT - 1 <= took < CONNECT_TIMEOUT + 10, took


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    if shutil.which("iptables") is None:
        pytest.skip("iptables is not installed (apt-get install iptables) to make a host silent")
    server = EmbeddedPostgres(base_dir=tmp_path / "pg").start()
    try:
        server.create_database("arm")
        migrate(server.url("arm"))
        yield server
    finally:
        server.destroy()


async def test_a_query_on_a_host_that_went_silent_fails_instead_of_hanging(
    pg: EmbeddedPostgres,
) -> None:
    pool = make_pool(
        Settings(
            database_url=f"{pg.url('arm')}?{SHORT_DEADLINES}",
            db_pool_timeout_seconds=60,
            nats_enabled=False,
            db_pool_max_size=2,
        )
    )
    await pool.open(wait=True)
    store = Store(pool)
    try:
        assert await store.outbox_ready_age() == 0  # the connection works
        assert pg.port is not None
        with black_hole(pg.port):
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable):
                await asyncio.wait_for(store.outbox_ready_age(), USER_TIMEOUT + 60)
            took = time.monotonic() - started
        print(f"\na query on a silent host failed after {took:.1f} s")
        assert took >= USER_TIMEOUT * 0.8, took  # TCP's deadline, not something sooner
        assert took < USER_TIMEOUT + 30, took

        # The host answers again: the pool replaces the dead connection by itself.
        async def answers() -> bool:
            try:
                age = await store.outbox_ready_age()
            except DatabaseUnavailable:
                return False
            assert age == 0
            return True

        await wait_for(answers, 60, "the pool connected again", every=0.5)
    finally:
        await pool.close(timeout=5)


def test_rules_of_a_killed_run_are_cleared_and_a_live_runs_are_kept() -> None:
    """iptables rules outlive the process that added them: a run killed inside
    black_hole leaves its port silenced. The next run's start removes those whose
    process is gone (tests/conftest.py), and never a rule of a run still going."""
    if shutil.which("iptables") is None:
        pytest.skip("iptables is not installed (apt-get install iptables)")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now
    dead_port, live_port = free_port(), free_port()
    dead = [
        "OUTPUT", "-o", "lo", "-p", "tcp", "--dport", str(dead_port), "-m", "comment",
        "--comment", f"{RULE_COMMENT}:{gone.pid}", "-j", "DROP",
    ]  # fmt: skip
    subprocess.run(["iptables", "-A", *dead], check=True, timeout=30)
    try:
        with black_hole(live_port):  # this process's own, still going
            removed = clear_black_holes()
            rules = subprocess.run(
                ["iptables", "-S", "OUTPUT"], check=True, capture_output=True, text=True
            ).stdout
            assert [f"--dport {dead_port} " in rule for rule in removed] == [True]
            assert f"--dport {dead_port} " not in rules
            assert f"--dport {live_port} " in rules and f"--sport {live_port} " in rules
    finally:
        subprocess.run(["iptables", "-D", *dead], capture_output=True, timeout=30)
