"""`arm-core migrate`: the roles, numbered migrations (yoyo), then the current functions
and who may call them.

1. The group roles of db/roles.sql (cluster-wide) are created where missing, and the
   migrating user is made a member of arm_owner (or :class:`RolesMissing`: ensure_roles).
2. Tables, types and indexes change only through db/migrations.
3. The functions and triggers in db/functions, then db/grants.sql, are applied on every
   run, in one transaction: a function never shows its default owner or PUBLIC's
   EXECUTE to anyone else.

Running migrate twice changes nothing. Concurrent runs on one database queue on an
advisory lock; runs on other databases of the cluster may create the roles at the same
time (db/roles.sql tolerates that).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from yoyo import get_backend, read_migrations

from arm_core.config import IDLE_IN_TRANSACTION_TIMEOUT_SECONDS, Settings
from arm_core.db import DatabaseError, Outage, connection_options, wrap_db_errors
from arm_core.store import SyncStore

log = logging.getLogger(__name__)

# pg_advisory_lock key that serialises concurrent `arm-core migrate` runs ("arm-core").
MIGRATE_LOCK_KEY = 0x61726D2D636F7265 & 0x7FFFFFFFFFFFFFFF


@dataclass(frozen=True)
class MigrateReport:
    applied_migrations: list[str]
    function_files: list[str]


# The tables the function files (re)create triggers on (10_triggers.sql, 80_status.sql):
# CREATE TRIGGER takes each one's SHARE ROW EXCLUSIVE lock, which every write waits for.
# Taken one after the other while the flow goes on, a write holding the second and
# waiting for the first (an upload writes stored_file before recognition_job) is a
# deadlock, and PostgreSQL kills one of the two: a rolling deploy's uploads failed so.
# So the functions' transaction first takes both at once, without waiting (NOWAIT):
# while it waits for nothing it is in no deadlock; refused, it tries again a moment later,
# until TRIGGER_LOCK_PATIENCE_SECONDS. Writes then wait for the transaction (well under a
# second) and go on.
TRIGGER_TABLES = ("arm.recognition_job", "arm.stored_file")
TRIGGER_LOCK_PATIENCE_SECONDS = 60.0
TRIGGER_LOCK_RETRY_SECONDS = 0.02

# db/, mapped to arm_core.sql by setuptools' package-dir (pyproject.toml): a copy in a
# wheel, a tree of links in the editable install (so not resolve(): that would follow a
# link back to src/arm_core, where there is no sql/).
SQL_DIR = Path(__file__).parent / "sql"

# The group roles db/roles.sql creates (docs/dbas.md "Database roles"), the owner first.
OWNER_ROLE = "arm_owner"
ROLES = (OWNER_ROLE, "arm_bridge", "arm_api", "arm_uploader", "arm_readonly")


class RolesMissing(DatabaseError):
    """The roles are missing, or the migrating user is not a member of arm_owner, and the
    migrating user may not change that. Nothing was migrated. The message (one line)
    says what is missing; `sql` is what a DBA runs once (as a superuser or a role with
    CREATEROLE), printed by `arm-core migrate` after it."""

    def __init__(self, message: str, sql: str) -> None:
        super().__init__(message)
        self.sql = sql


def yoyo_url(
    database_url: str, idle_in_transaction: float = IDLE_IN_TRANSACTION_TIMEOUT_SECONDS
) -> str:
    """`database_url` (any connection string libpq reads: a URL with one or several hosts,
    or the key=value form) as yoyo's URL, with the options of every connection
    (arm_core.db.connection_options). yoyo parses its URL with urllib, which takes
    neither several hosts nor key=value, and hands the query's parameters to
    psycopg.connect: so every parameter goes in the query, the netloc stays empty, and
    libpq reads them as it reads DATABASE_URL itself (target_session_attrs included)."""
    params = {k: str(v) for k, v in conninfo_to_dict(database_url).items()}
    options = connection_options(database_url, idle_in_transaction=idle_in_transaction)
    return "postgresql+psycopg:///?" + urlencode(params | options)


@contextlib.contextmanager
def _yoyo(database_url: str, idle_in_transaction: float) -> Iterator[tuple[Any, Any]]:
    """yoyo's backend (holding its lock) and the migrations of db/migrations."""
    backend = get_backend(yoyo_url(database_url, idle_in_transaction))
    try:
        with backend.lock():
            yield backend, read_migrations(str(SQL_DIR / "migrations"))
    finally:
        backend.connection.close()


def function_files(root: Path) -> list[Path]:
    return sorted((root / "functions").glob("*.sql"))


def _state(conn: psycopg.Connection) -> tuple[str, list[str], bool, bool]:
    """The migrating user, the roles still missing, whether it may create roles, and
    whether it has arm_owner's privileges."""
    row = conn.execute(
        """
        SELECT current_user::text,
               array(SELECT r FROM unnest(%(roles)s::text[]) WITH ORDINALITY AS u(r, n)
                     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r)
                     ORDER BY n),
               (SELECT rolsuper OR rolcreaterole FROM pg_catalog.pg_roles
                WHERE rolname = current_user),
               CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %(owner)s)
                    THEN pg_catalog.pg_has_role(current_user, %(owner)s, 'USAGE')
                    ELSE false END
        """,
        {"roles": list(ROLES), "owner": OWNER_ROLE},
    ).fetchone()
    assert row is not None
    user, missing, may_create, owner = row
    return user, list(missing), bool(may_create), bool(owner)


def dba_sql(conn: psycopg.Connection, user: str, missing: list[str]) -> str:
    """What a DBA runs once for `user` to migrate: db/roles.sql when roles are missing,
    and the membership in arm_owner."""
    grant = _format(conn, "GRANT %I TO %I;", OWNER_ROLE, user)
    parts = [(SQL_DIR / "roles.sql").read_text(encoding="utf-8").strip()] if missing else []
    return "\n\n".join([*parts, grant]) + "\n"


def _format(conn: psycopg.Connection, template: str, *names: str) -> str:
    """SQL for a DBA to read and run: PostgreSQL's format(), which quotes an identifier
    only where it must."""
    args = sql.SQL("").join(sql.SQL(", %s::text") for _ in names)
    row = conn.execute(sql.SQL("SELECT format(%s::text{})").format(args), (template, *names))
    found = row.fetchone()
    assert found is not None
    return str(found[0])


def ensure_roles(conn: psycopg.Connection) -> list[str]:
    """Creates the roles of db/roles.sql that are missing and makes the migrating user a
    member of arm_owner (it owns what the migrations create, and alters it later).
    Returns the roles it created. Raises :class:`RolesMissing` before the migrations,
    naming what a DBA runs once, when the migrating user may not do that."""
    user, missing, may_create, owner = _state(conn)
    if missing and not may_create:
        raise RolesMissing(
            f"migrate: the roles {', '.join(missing)} do not exist, and the migrating user "
            f'"{user}" may not create roles (it is neither a superuser nor has CREATEROLE). '
            "Nothing was changed. A DBA runs the SQL below once for the cluster, as a "
            "superuser or a role with CREATEROLE; then run `arm-core migrate` again.",
            dba_sql(conn, user, missing),
        )
    if missing:
        conn.execute((SQL_DIR / "roles.sql").read_text(encoding="utf-8"))
        log.info("created roles %s", ", ".join(missing), extra={"action": "migrate"})
        owner = _state(conn)[3]
    if owner:
        return missing
    try:
        conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(OWNER_ROLE)))
    except psycopg.errors.UniqueViolation:
        pass  # a migrate of another database made the same grant meanwhile
    except psycopg.errors.InsufficientPrivilege:
        raise RolesMissing(
            f'migrate: the migrating user "{user}" is not a member of {OWNER_ROLE}, which '
            "owns schema arm, and may not make itself one. No migration was applied. A DBA "
            "runs the SQL below once; then run `arm-core migrate` again.",
            dba_sql(conn, user, []),
        ) from None
    if not _state(conn)[3]:
        raise RolesMissing(
            f'migrate: the migrating user "{user}" is a member of {OWNER_ROLE} but does not '
            "inherit its privileges (NOINHERIT). No migration was applied. A DBA runs the "
            "SQL below once; then run `arm-core migrate` again.",
            _format(conn, "ALTER ROLE %I INHERIT;", user) + "\n",
        )
    log.info("made %s a member of %s", user, OWNER_ROLE, extra={"action": "migrate"})
    return missing


def apply_functions(
    conn: psycopg.Connection, root: Path, patience: float = TRIGGER_LOCK_PATIENCE_SECONDS
) -> list[str]:
    """Applies every db/functions file, in name order, then db/grants.sql (owners and
    privileges), in one transaction, with search_path = pg_catalog, pg_temp: the
    migrating user's own path cannot change what they mean. Needs db/roles.sql's roles.
    The transaction starts with TRIGGER_TABLES' locks, taken together when no write
    holds them (tried again until `patience` seconds have passed; then LockNotAvailable)."""
    deadline = time.monotonic() + patience
    refused = 0
    while True:
        try:
            return _apply_functions(conn, root)
        except errors.LockNotAvailable:
            refused += 1
            if time.monotonic() >= deadline:
                log.error(
                    "no moment without writes on %s in %.0f s (%d tries): functions not "
                    "applied; run migrate again",
                    ", ".join(TRIGGER_TABLES),
                    patience,
                    refused,
                    extra={"action": "migrate"},
                )
                raise
            time.sleep(TRIGGER_LOCK_RETRY_SECONDS)


def _apply_functions(conn: psycopg.Connection, root: Path) -> list[str]:
    names = []
    with conn.transaction():
        conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
        conn.execute(
            sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE NOWAIT").format(
                sql.SQL(", ").join(sql.Identifier(*name.split(".")) for name in TRIGGER_TABLES)
            )
        )
        for path in function_files(root):
            conn.execute(path.read_text(encoding="utf-8"))
            names.append(path.name)
        conn.execute((root / "grants.sql").read_text(encoding="utf-8"))
    return names


def apply_settings(conn: psycopg.Connection, settings: Settings) -> None:
    """Writes the settings the database needs from the environment, when given there."""
    store = SyncStore(conn)
    if "DEFAULT_MAX_ATTEMPTS" in settings.explicit:
        store.set_setting("default_max_attempts", str(settings.default_max_attempts))
    if "TIMEOUT_SWEEP_SECONDS" in settings.explicit:
        store.set_sweep_interval(settings.timeout_sweep_seconds)


@contextlib.contextmanager
def _locked(
    database_url: str, action: str, idle_in_transaction: float
) -> Iterator[psycopg.Connection[Any]]:
    """A connection holding migrate's advisory lock for the block: concurrent
    `arm-core migrate` and `rollback` runs wait their turn. Errors name `action`."""
    options = connection_options(database_url, idle_in_transaction=idle_in_transaction)
    with (
        wrap_db_errors(action, Outage()),
        psycopg.connect(make_conninfo(database_url, **options), autocommit=True) as conn,
    ):
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK_KEY,))
        try:
            yield conn
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK_KEY,))


def migrate(database_url: str, settings: Settings | None = None) -> MigrateReport:
    """Brings the database at database_url up to date. Idempotent and safe to run
    concurrently: runs queue on an advisory lock held for the whole migration."""
    settings = settings or Settings()
    idle = settings.db_idle_in_transaction_timeout_seconds
    with _locked(database_url, "migrate", idle) as conn:
        ensure_roles(conn)
        with _yoyo(database_url, idle) as (backend, migrations):
            pending = backend.to_apply(migrations)
            backend.apply_migrations(pending)
        applied = [m.id for m in pending]
        files = apply_functions(conn, SQL_DIR)
        with conn.transaction():
            apply_settings(conn, settings)
    for migration_id in applied:
        log.info("applied migration %s", migration_id, extra={"action": "migrate"})
    log.info("applied %d function files", len(files), extra={"action": "migrate"})
    return MigrateReport(applied_migrations=applied, function_files=files)


class UnknownMigration(ValueError):
    """`arm-core rollback` named a migration db/migrations does not have."""


def rollback_to(database_url: str, migration_id: str) -> list[str]:
    """Rolls back migration `migration_id` and every later one that is applied, newest
    first, each with its .rollback.sql, under migrate's lock. Returns their ids. The
    function files stay as they are: the previous version's `arm-core migrate` (run next)
    applies its own."""
    idle = IDLE_IN_TRANSACTION_TIMEOUT_SECONDS
    with (
        _locked(database_url, "rollback", idle),
        _yoyo(database_url, idle) as (backend, migrations),
    ):
        ids = [m.id for m in migrations]
        if migration_id not in ids:
            raise UnknownMigration(
                f"rollback: no migration {migration_id!r} in this version "
                f"(it has {ids[0]} to {ids[-1]})"
            )
        later = set(ids[ids.index(migration_id) :])
        todo = backend.to_rollback(migrations.filter(lambda m: m.id in later))
        backend.rollback_migrations(todo)
    for migration in todo:
        log.info("rolled back migration %s", migration.id, extra={"action": "migrate"})
    return [m.id for m in todo]
