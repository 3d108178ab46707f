"""A PostgreSQL primary and a streaming standby on loopback, and the multi-host URL that
follows the writable one (tests/e2e/test_pg_failover.py, benchmarks/chaos.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg

from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.polling import wait_for_sync

STANDBY = "arm_standby"  # its application_name (synchronous_standby_names names it)


@dataclass
class Replicated:
    primary: EmbeddedPostgres
    standby: EmbeddedPostgres
    synchronous: bool

    def url(self, dbname: str) -> str:
        """Both hosts, writes wanted: libpq connects to whichever takes them."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},"
            f"127.0.0.1:{self.standby.port}/{dbname}?target_session_attrs=read-write"
        )

    def destroy(self) -> None:
        self.standby.destroy()
        self.primary.destroy()


def start_pair(base: Path, synchronous: bool) -> Replicated:
    """A primary and its standby (pg_basebackup -R), streaming; with `synchronous` the
    primary names the standby in synchronous_standby_names, so a commit returns only
    once the standby has its WAL. Databases that must not lose a commit reported to a
    client also need synchronous_commit=on (the embedded server runs with it off)."""
    primary = EmbeddedPostgres(base_dir=base / "primary").start()
    standby = EmbeddedPostgres(
        base_dir=base / "standby", standby_of=primary, application_name=STANDBY
    )
    try:
        standby.start()
        _replicate(primary, synchronous)
    except BaseException:
        standby.destroy()
        primary.destroy()
        raise
    return Replicated(primary, standby, synchronous)


def _replicate(primary: EmbeddedPostgres, synchronous: bool) -> None:
    """Names the standby synchronous (or not) and waits until it streams so."""
    wanted = "sync" if synchronous else "async"
    with psycopg.connect(primary.url(), autocommit=True) as conn:
        if synchronous:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'")
            conn.execute("SELECT pg_reload_conf()")
        state = "no row"  # the standby's last sync_state in pg_stat_replication

        def streaming() -> bool:
            nonlocal state
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY,),
            ).fetchone()
            state = "no row" if row is None else str(row[0])
            return state == wanted

        wait_for_sync(streaming, 30, lambda: f"the standby streaming ({wanted}): {state}")
