"""The suite's databases on its PostgreSQL (conftest's pg_server): the migrated template,
and the one way to clone it, for a test (conftest's db_url) or for a module that builds
something slow once (a fixture of scope module)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import psycopg
from psycopg import sql
from pytest_postgresql.janitor import DatabaseJanitor

from arm_core.devtools.embedded_postgres import EmbeddedPostgres

TEMPLATE_DB = "arm_template"


def janitor(
    server: EmbeddedPostgres, dbname: str, template: str | None = None, as_template: bool = False
) -> DatabaseJanitor:
    """pytest-postgresql's janitor of database `dbname` on `server`."""
    assert server.port is not None
    return DatabaseJanitor(
        user=server.user,
        host="127.0.0.1",
        port=server.port,
        dbname=dbname,
        template_dbname=template,
        as_template=as_template,
    )


@contextlib.contextmanager
def clone(
    server: EmbeddedPostgres, prefix: str, template: str | None = TEMPLATE_DB
) -> Iterator[str]:
    """A new database `<prefix>_<random>`, a copy of `template` (None: empty), dropped
    at the end; yields its URL (the superuser's).

    Every test pays for this, so it is two statements, not the janitor's four: the copy
    is made file by file (STRATEGY FILE_COPY: half the time of the default, which writes
    each of the template's pages to the WAL; the suite's server runs without fsync, so
    the checkpoint it asks for costs little), and the drop ends the test's leftover
    sessions itself (WITH (FORCE))."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create += sql.SQL(" TEMPLATE {} STRATEGY FILE_COPY").format(sql.Identifier(template))
    with psycopg.connect(server.url("postgres"), autocommit=True) as admin:
        admin.execute(create)
    try:
        yield server.url(name)
    finally:
        server.drop_database(name)
