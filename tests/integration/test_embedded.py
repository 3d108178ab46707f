"""Real PostgreSQL and nats-server started by arm_core.devtools.embedded_postgres and
embedded_nats (no mocks, no fixed ports)."""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import psycopg
import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats, EmbeddedNatsCluster
from arm_core.devtools.embedded_postgres import EmbeddedPostgres


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(base_dir=tmp_path_factory.mktemp("pg"))
    try:
        yield server.start()
    finally:
        server.destroy()


def test_select_1(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(pg.url()) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        assert conn.execute("select current_user").fetchone() == ("postgres",)
    assert pg.url("x") == f"postgresql://postgres@127.0.0.1:{pg.port}/x"


def test_postgres_user_can_reach_the_cluster(pg: EmbeddedPostgres) -> None:
    if os.geteuid() != 0:
        pytest.skip("only meaningful as root")
    uid = pwd.getpwnam("postgres").pw_uid
    assert pg.data_dir.stat().st_uid == uid
    for ancestor in pg.data_dir.parents:
        st = ancestor.stat()
        assert st.st_uid == uid or st.st_mode & stat.S_IXOTH, ancestor


def test_create_database_from_template(pg: EmbeddedPostgres) -> None:
    pg.create_database("tmpl-src")
    with psycopg.connect(pg.url("tmpl-src")) as conn:
        conn.execute("create table t (v int)")
        conn.execute("insert into t values (42)")
    pg.create_database("copy", template="tmpl-src")
    pg.create_database("copy", template="tmpl-src")  # idempotent
    with psycopg.connect(pg.url("copy"), autocommit=True) as conn:
        assert conn.execute("select v from t").fetchone() == (42,)
        # WITH (FORCE) drops it even with this connection still open.
        pg.drop_database("copy")
    pg.drop_database("copy")  # idempotent
    pg.drop_database("tmpl-src")
    with psycopg.connect(pg.url()) as conn:
        names = conn.execute("select datname from pg_database").fetchall()
    assert ("copy",) not in names and ("tmpl-src",) not in names


def test_stop_and_start_reuses_data_dir(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("create table kept (v text)")
        conn.execute("insert into kept values ('survives')")
    with pytest.raises(RuntimeError, match="already running"):
        pg.start()
    port = pg.port
    pg.stop()
    pg.stop()  # idempotent
    assert not (pg.data_dir / "postmaster.pid").exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg.url(), connect_timeout=2).close()

    # A server that died without cleaning up leaves a stale postmaster.pid behind.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    (pg.data_dir / "postmaster.pid").write_text(f"{dead.stdout.strip()}\n{pg.data_dir}\n")

    pg.start()
    assert pg.port == port
    with psycopg.connect(pg.url()) as conn:
        assert conn.execute("select v from kept").fetchone() == ("survives",)
        conn.execute("drop table kept")


def test_second_instance_reuses_cluster(pg: EmbeddedPostgres) -> None:
    """What a second `arm-core dev` run does: a new object on the same base_dir."""
    pg.stop()
    again = EmbeddedPostgres(base_dir=pg.base_dir)
    assert again.data_dir == pg.data_dir
    again.start()
    try:
        with psycopg.connect(again.url()) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        again.stop()
    pg.start()


async def _roundtrip(url: str, subject: str) -> bytes:
    nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
    try:
        sub = await nc.subscribe(subject)
        await nc.flush()
        await nc.publish(subject, b"ping")
        msg = await asyncio.wait_for(sub.next_msg(timeout=None), timeout=5)
        return msg.data
    finally:
        await nc.close()


def test_nats_roundtrip_and_restart_on_same_port(tmp_path: Path) -> None:
    server = EmbeddedNats(log_dir=tmp_path)
    with server:
        assert server.running
        port = server.port
        assert port is not None
        assert server.url() == f"nats://127.0.0.1:{port}"
        assert asyncio.run(_roundtrip(server.url(), "arm.test")) == b"ping"

        server.stop()
        assert not server.running
        server.stop()  # idempotent
        server.start()
        assert server.port == port
        assert asyncio.run(_roundtrip(server.url(), "arm.test")) == b"ping"

        server.restart()
        assert server.running and server.port == port
        assert asyncio.run(_roundtrip(server.url(), "arm.again")) == b"ping"
    assert not server.running


def test_nats_explicit_port() -> None:
    port = free_port()
    with EmbeddedNats(port=port) as server:
        assert server.url() == f"nats://127.0.0.1:{port}"
        assert asyncio.run(_roundtrip(server.url(), "arm.explicit")) == b"ping"
        log_dir = server.log_dir
        assert log_dir is not None and log_dir.is_dir()
    assert not log_dir.exists()  # the temporary log folder it created is removed


def test_nats_startup_failure_reports_log(tmp_path: Path) -> None:
    server = EmbeddedNats(log_dir=tmp_path, extra_args=["-c", str(tmp_path / "missing.conf")])
    with pytest.raises(RuntimeError, match="exited"):
        server.start()
    assert not server.running


def test_a_nats_cluster_that_does_not_form_is_started_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes that dial each other at once may both close the route as a duplicate
    and never dial again: the start then begins again on fresh ports with empty stores.
    The fault is injected into the formation check of the first attempt only; the
    servers are real."""
    real = EmbeddedNatsCluster._unformed
    first: list[list[int]] = []

    def unformed(self: EmbeddedNatsCluster, index: int) -> str | None:
        if not first:
            first.append(list(self.monitor_ports))
        return (
            "no route to anyone (injected)" if self.monitor_ports == first[0] else real(self, index)
        )

    monkeypatch.setattr(EmbeddedNatsCluster, "_unformed", unformed)
    cluster = EmbeddedNatsCluster(size=2, base_dir=tmp_path / "nats", jetstream=True)
    try:
        cluster.start(timeout=3)
        assert first and cluster.monitor_ports != first[0]
        assert all(real(cluster, i) is None for i in range(2))
        assert asyncio.run(_roundtrip(cluster.urls()[1], "arm.formed")) == b"ping"
    finally:
        cluster.stop()


def test_a_nats_cluster_that_never_forms_says_what_each_node_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EmbeddedNatsCluster, "_unformed", lambda self, index: "no route (injected)")
    cluster = EmbeddedNatsCluster(size=2, base_dir=tmp_path / "nats")
    with pytest.raises(RuntimeError) as raised:
        cluster.start(timeout=1)
    said = str(raised.value)
    assert said.startswith("could not start a 2-node NATS cluster: NATS cluster not formed")
    assert "n1: no route (injected); n2: no route (injected)" in said
    assert not any(cluster.running(i) for i in range(2))
