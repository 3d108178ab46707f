"""An outage of the database is one event in the log: started once with its
cause, repeated at most every Outage.report_every seconds while it lasts, ended once
with its length — however many queries, pool connection attempts and LISTEN reconnects
meet it. And the connection options every process adds to DATABASE_URL."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlsplit

import pytest
from psycopg.conninfo import conninfo_to_dict

from arm_core.config import IDLE_IN_TRANSACTION_TIMEOUT_SECONDS, Settings
from arm_core.db import (
    CONNECTION_DEFAULTS,
    Outage,
    connection_options,
    pool_log_to,
    unclaimed_pool_name,
)
from arm_core.migrate import yoyo_url


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def outage_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "db_outage"]


def test_an_outage_is_logged_once_at_a_bounded_rate_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outage = Outage(clock)
    caplog.set_level(logging.INFO, logger="arm_core.db")
    outage.available()  # nothing to end
    for _ in range(200):  # many failures a second, for 29 s
        outage.failed("connection refused")
        clock.now += 0.145
    states = [r.state for r in outage_records(caplog)]  # type: ignore[attr-defined]
    assert states == ["started"]
    assert outage_records(caplog)[0].getMessage() == "database unavailable: connection refused"
    clock.now += 2  # 31 s after the start
    outage.failed("connection refused")
    outage.failed("connection refused")
    ongoing = outage_records(caplog)[1:]
    assert [r.state for r in ongoing] == ["ongoing"]  # type: ignore[attr-defined]
    assert ongoing[0].getMessage().startswith("database still unavailable after 31 s (201 ")
    clock.now += 4.5
    outage.available()
    outage.available()
    ended = outage_records(caplog)[2:]
    assert [r.state for r in ended] == ["ended"]  # type: ignore[attr-defined]
    assert ended[0].getMessage() == "database available again after 35.5 s (202 failed attempts)"
    assert ended[0].levelno == logging.WARNING and ended[0].seconds == 35.5  # type: ignore[attr-defined]
    outage.failed("again")  # a new outage starts a new event
    assert [r.state for r in outage_records(caplog)[3:]] == ["started"]  # type: ignore[attr-defined]


def test_the_pools_connection_failures_become_the_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """psycopg_pool's warning per failed attempt (naming every host, maybe the URL) is
    not logged as such: it starts the outage of the pool's own process, with the
    password masked. Another pool's failures are not this outage's, and nothing is
    routed once the pool's block has ended."""
    outage, other = Outage(Clock()), Outage(Clock())
    pool_log = logging.getLogger("psycopg.pool")
    before = list(pool_log.filters)
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="psycopg.pool")
    said = "connection to server at 127.0.0.1 failed: postgresql://arm:Pw9xQ2vL7k@db1/arm"
    with pool_log_to("arm-core-a", outage), pool_log_to("arm-core-b", other):
        for _ in range(5):
            pool_log.warning("error connecting in %r: %s", "arm-core-a", said)
        pool_log.warning("error connecting in %r: %s", "arm-core-b", said)
        pool_log.warning("discarding closed connection: %s", "<conn>")
        pool_log.info("growing pool %r to %s", "arm-core-a", 2)
        from_pool = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"]
        assert from_pool == ["growing pool 'arm-core-a' to 2"]
        started, started_too = outage_records(caplog)
        assert (started.state, started_too.state) == ("started", "started")  # type: ignore[attr-defined]
        assert "Pw9xQ2vL7k" not in started.getMessage()
        assert "arm:***@db1" in started.getMessage()
        assert (outage.count, other.count) == (5, 1)
        outage.available()
        other.available()
        pool_log.warning("discarding closed connection: %s", "<conn>")  # no outage: shown
        assert [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"][-1] == (
            "discarding closed connection: <conn>"
        )
    assert pool_log.filters == before
    pool_log.warning("error connecting in %r: %s", "arm-core-a", said)  # no longer routed
    assert outage.count == 0
    assert [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"][-1].startswith(
        "error connecting in 'arm-core-a'"
    )


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://arm:p%40ss%26w@db1:5432,db2:5433/arm?target_session_attrs=read-write",
        "host=db1,db2 port=5432,5433 dbname=arm user=arm password='p@ss&w' "
        "target_session_attrs=read-write",
    ],
)
def test_every_connection_string_libpq_reads_goes_to_yoyo_whole(url: str) -> None:
    """yoyo parses its URL with urllib (one host, no key=value): the parameters go in
    its query, which it hands to psycopg.connect as they are."""
    parts = urlsplit(yoyo_url(url))
    assert (parts.scheme, parts.netloc, parts.path) == ("postgresql+psycopg", "", "/")
    assert dict(parse_qsl(parts.query)) == {
        "host": "db1,db2",
        "port": "5432,5433",
        "dbname": "arm",
        "user": "arm",
        "password": "p@ss&w",
        "target_session_attrs": "read-write",
        **CONNECTION_DEFAULTS,
        "options": "-c idle_in_transaction_session_timeout=20000",
    }


def test_connection_options_leave_what_the_url_sets() -> None:
    def options(url: str) -> dict[str, str]:
        return connection_options(url, idle_in_transaction=0)

    assert options("postgresql://arm@db/arm") == CONNECTION_DEFAULTS
    given = options("postgresql://arm@db/arm?connect_timeout=30&keepalives=0")
    assert "connect_timeout" not in given and "keepalives" not in given
    assert given["keepalives_idle"] == CONNECTION_DEFAULTS["keepalives_idle"]
    assert "connect_timeout" not in options("host=db connect_timeout=2")


IDLE_20S = "-c idle_in_transaction_session_timeout=20000"


def test_every_connection_gets_the_idle_in_transaction_timeout_beside_the_urls_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGOPTIONS", raising=False)
    default = Settings().db_idle_in_transaction_timeout_seconds
    assert default == IDLE_IN_TRANSACTION_TIMEOUT_SECONDS == 20

    def options(url: str, seconds: float = default) -> str | None:
        return connection_options(url, idle_in_transaction=seconds).get("options")

    assert options("postgresql://arm@db/arm") == IDLE_20S
    assert options("postgresql://arm@db/arm", 0.0001) == (
        "-c idle_in_transaction_session_timeout=1"  # never 0, which would turn it off
    )
    assert options("postgresql://arm@db/arm", 0) is None  # the server's setting
    # The URL's own options are kept, the timeout after them.
    assert options("postgresql://arm@db/arm?options=-c%20search_path%3Dx") == (
        f"-c search_path=x {IDLE_20S}"
    )
    assert options("host=db options='-c work_mem=64MB'") == f"-c work_mem=64MB {IDLE_20S}"
    # PGOPTIONS, which libpq reads only when the connection string has no options.
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=60s")
    assert options("postgresql://arm@db/arm") == f"-c statement_timeout=60s {IDLE_20S}"
    assert options("host=db options='-c work_mem=64MB'") == f"-c work_mem=64MB {IDLE_20S}"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://arm@db/arm?options=-c%20idle_in_transaction_session_timeout%3D5min",
        "host=db options='-cidle_in_transaction_session_timeout=0'",
        "host=db options='--idle-in-transaction-session-timeout=7s -c work_mem=1MB'",
    ],
)
def test_a_database_url_that_sets_the_idle_in_transaction_timeout_keeps_it(url: str) -> None:
    assert "options" not in connection_options(url, idle_in_transaction=20)
    given = conninfo_to_dict(url)["options"]
    assert dict(parse_qsl(urlsplit(yoyo_url(url, 20)).query))["options"] == given


def test_a_process_s_pool_is_arm_core_and_a_second_one_gets_a_name_of_its_own() -> None:
    """What the outage's log line quotes: `arm-core` in a process (it has one pool);
    in a test process holding several, each routed pool's name is its own."""
    assert unclaimed_pool_name() == "arm-core"
    with pool_log_to(unclaimed_pool_name(), Outage()):
        second = unclaimed_pool_name()
        with pool_log_to(second, Outage()):
            assert (second, unclaimed_pool_name()) == ("arm-core-2", "arm-core-3")
    assert unclaimed_pool_name() == "arm-core"
