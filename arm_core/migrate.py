"""`arm-core migrate`: numbered migrations (yoyo), then the current functions.

Tables, types and indexes change only through db/migrations; the functions and
triggers in db/functions are applied after them on every run (CREATE OR REPLACE), so
running migrate twice changes nothing. Concurrent runs queue on an advisory lock.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from yoyo import get_backend, read_migrations

from arm_core.config import Settings
from arm_core.db import wrap_db_errors
from arm_core.store import SyncStore

log = logging.getLogger(__name__)

# pg_advisory_lock key that serialises concurrent `arm-core migrate` runs ("arm-core").
MIGRATE_LOCK_KEY = 0x61726D2D636F7265 & 0x7FFFFFFFFFFFFFFF


@dataclass(frozen=True)
class MigrateReport:
    applied_migrations: list[str]
    function_files: list[str]


# db/ of the checkout (arm_core/sql is a symlink to it) or of the installed package.
SQL_DIR = Path(__file__).resolve().parent / "sql"


def yoyo_url(database_url: str) -> str:
    """yoyo needs the psycopg 3 driver named in the scheme."""
    scheme, sep, rest = database_url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a postgresql:// URL: {database_url!r}")
    return f"postgresql+psycopg://{rest}"


@contextlib.contextmanager
def _yoyo(database_url: str) -> Iterator[tuple[Any, Any]]:
    """yoyo's backend (holding its lock) and the migrations of db/migrations."""
    backend = get_backend(yoyo_url(database_url))
    try:
        with backend.lock():
            yield backend, read_migrations(str(SQL_DIR / "migrations"))
    finally:
        backend.connection.close()


def function_files(root: Path) -> list[Path]:
    return sorted((root / "functions").glob("*.sql"))


def apply_functions(conn: psycopg.Connection, root: Path) -> list[str]:
    """Applies every db/functions file, in name order, in one transaction."""
    names = []
    with conn.transaction():
        for path in function_files(root):
            conn.execute(path.read_text(encoding="utf-8"))
            names.append(path.name)
    return names


def apply_settings(conn: psycopg.Connection, settings: Settings) -> None:
    """Writes the settings the database needs from the environment, when given there."""
    store = SyncStore(conn)
    if "DEFAULT_MAX_ATTEMPTS" in settings.explicit:
        store.set_setting("default_max_attempts", str(settings.default_max_attempts))
    if "TIMEOUT_SWEEP_SECONDS" in settings.explicit:
        store.set_sweep_interval(settings.timeout_sweep_seconds)


def migrate(database_url: str, settings: Settings | None = None) -> MigrateReport:
    """Brings the database at database_url up to date. Idempotent and safe to run
    concurrently: runs queue on an advisory lock held for the whole migration."""
    settings = settings or Settings()
    with wrap_db_errors("migrate"), psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK_KEY,))
        try:
            with _yoyo(database_url) as (backend, migrations):
                pending = backend.to_apply(migrations)
                backend.apply_migrations(pending)
            applied = [m.id for m in pending]
            files = apply_functions(conn, SQL_DIR)
            with conn.transaction():
                apply_settings(conn, settings)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK_KEY,))
    for migration_id in applied:
        log.info("applied migration %s", migration_id, extra={"action": "migrate"})
    log.info("applied %d function files", len(files), extra={"action": "migrate"})
    return MigrateReport(applied_migrations=applied, function_files=files)


def rollback_all(database_url: str) -> list[str]:
    """Rolls every applied migration back (for tests and a DBA's clean-up)."""
    with _yoyo(database_url) as (backend, migrations):
        todo = backend.to_rollback(migrations)
        backend.rollback_migrations(todo)
    return [m.id for m in todo]
