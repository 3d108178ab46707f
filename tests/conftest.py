"""Shared fixtures: a real PostgreSQL started by the suite on a free loopback port, a
migrated template database, and a fresh clone of it for every test (as Procrastinate's
conftest does). Nothing here depends on a server already running on the machine.

`db_url` is the superuser's, for setup and assertions. The bridge and the API under test
connect as logins of their roles (tests/support/sql.py LOGINS, created with the
template): tests/support/bridge.py fast_settings, api.py api_settings and processes.py
ArmProcess switch the URL; `bridge_db_url` is the same database as the bridge's login,
for a pool a test builds itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from nats.aio.client import Client
from psycopg.rows import dict_row

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.migrate import migrate
from tests.support.bridge import nats_client
from tests.support.databases import TEMPLATE_DB, clone, janitor
from tests.support.sql import BRIDGE_LOGIN, Conn, as_login, ensure_logins
from tests.support.stack import Stack, running_stack

# Under CI=true a skipped test fails the run (.ci/run installs every optional dependency).
pytest_plugins = ["tests.support.ci_skips"]


ROOT = Path(__file__).resolve().parents[1]
# The folders package-dir maps into arm_core (pyproject.toml), and where under it.
PACKAGE_DIRS = {"src/arm_core": "", "bridge": "bridge", "http": "http", "db": "sql"}


# The fast tier, `make check` (the marker `check`): the unit tests, the state machine and
# store against a real PostgreSQL, and the bridge's loops one step at a time. Everything
# else (processes as users run them, clusters, containers, the browser, Prometheus,
# faults) runs in `make test` only, with these.
CHECK_TIER = ("tests/unit/", "tests/integration/", "tests/bridge/test_steps.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        where = Path(item.path).resolve().relative_to(ROOT).as_posix()
        if where.startswith(CHECK_TIER):
            item.add_marker(pytest.mark.check)


def pytest_sessionstart(session: pytest.Session) -> None:
    """The strict editable install (Makefile) links each file of the package: a module or
    migration added since is not importable until `make install` links it again. Say so
    at once, instead of a test failing on a migration it cannot see."""
    import arm_core

    installed = Path(arm_core.__file__).parent
    if installed == ROOT / "src" / "arm_core":
        return  # not through the link tree (a wheel's copy is checked by its own build)
    missing = [
        f"{folder}/{path.relative_to(ROOT / folder)}"
        for folder, target in PACKAGE_DIRS.items()
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".sql")
        and "__pycache__" not in path.parts
        and path.name != "schema.sql"
        and not (installed / target / path.relative_to(ROOT / folder)).exists()
    ]
    if missing:
        pytest.exit(f"not in the installed package yet: {', '.join(missing)}; run `make install`")


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(base_dir=tmp_path_factory.mktemp("postgres"))
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def template_db(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A database migrated once per session; every test clones it."""
    made = janitor(pg_server, TEMPLATE_DB, as_template=True)
    made.init()
    migrate(pg_server.url(TEMPLATE_DB))
    ensure_logins(pg_server.url(TEMPLATE_DB))  # the roles exist now; so do their logins
    try:
        yield TEMPLATE_DB
    finally:
        made.drop()


@pytest.fixture
def db_url(pg_server: EmbeddedPostgres, template_db: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    with clone(pg_server, "arm_test", template_db) as url:
        yield url


@pytest.fixture
def bridge_db_url(db_url: str) -> str:
    """The test's database as the bridge's login (a member of arm_bridge only)."""
    return as_login(db_url, BRIDGE_LOGIN)


@pytest.fixture
def empty_db_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A fresh database with nothing in it (for migration tests)."""
    with clone(pg_server, "arm_empty", None) as url:
        yield url


@pytest.fixture
def conn(db_url: str) -> Iterator[Conn]:
    """An autocommit connection to the test's database, as a DBA's psql session."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as connection:
        yield connection


def own_nats(tmp_path: Path, *args: str) -> Iterator[EmbeddedNats]:
    """The NATS fixtures' one way to run a server: a real nats-server of this test's own
    on a free loopback port, with `args`, stopped after the test."""
    server = EmbeddedNats(log_dir=tmp_path / "nats", extra_args=list(args)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server of this test's own (no JetStream)."""
    yield from own_nats(tmp_path)


@pytest.fixture
def js_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """The same with JetStream (its store in the test's own folder)."""
    yield from own_nats(tmp_path, "-js", "-sd", str(tmp_path / "js"))


@pytest.fixture
def small_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server that takes messages of at most 3 KiB (max_payload)."""
    config = tmp_path / "small.conf"
    config.write_text("max_payload: 3072\n")
    yield from own_nats(tmp_path, "-c", str(config))


@pytest.fixture
async def js_client(js_server: EmbeddedNats) -> AsyncIterator[Client]:
    """The test's own connection to the JetStream server."""
    nc = await nats_client(js_server.url())
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
async def client(nats_server: EmbeddedNats) -> AsyncIterator[Client]:
    """The test's own NATS connection: plays the services (or the core)."""
    nc = await nats_client(nats_server.url())
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Iterator[Stack]:
    """`arm-core serve` / `bridge` / `reference` as subprocesses, as users run them, with
    a nats-server of the test's own (tests/support/stack.py)."""
    yield from running_stack(db_url, tmp_path)
