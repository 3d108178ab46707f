"""Database access: the named queries of queries.sql, one boundary for driver errors,
the options every connection gets, and the outage log.

Python never writes the job tables itself; every query here calls a function of
db/functions, and the runtime sends them only through arm_core.store. Driver errors
become :class:`DatabaseUnavailable` (the server cannot be reached, or is read-only — a
standby: retrying later makes sense), :class:`DatabaseConflict` (a concurrent
transaction got in the way: a second try may pass at once) or :class:`DatabaseError`
(anything else); a wait for a connection that ran out while every connection of the
pool was in use is :class:`DatabasePoolExhausted`, logged by :class:`PoolExhaustion`.

An outage is one event for the operator, however many connections and tasks meet it:
the process's :class:`Outage` logs it as an arm_core.episodes.Episode. Every failure
goes there — a query's (wrap_db_errors), the pool's connection attempts (its log
records, taken over by :func:`pool_log_to`), the LISTEN connection's — and the first
success ends it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.errors import ReadOnlySqlTransaction

from arm_core.episodes import Episode
from arm_core.redaction import mask_urls_in

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


class DatabaseError(Exception):
    """A database call failed for a reason other than the server being unreachable."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached right now (connection refused, lost, timed out)."""


class DatabaseConflict(DatabaseError):
    """The database answered and rolled the call back because a concurrent transaction
    got in the way: a deadlock, a serialization failure, a lock not available. Nothing
    of the call was done; the same call again may pass."""


@dataclass(frozen=True)
class PoolFigures:
    """The process's pool as it stands (Store.pool_figures). `connecting`: the pool's
    connections neither `in_use` (taken by the store) nor `idle`, being opened or opened
    again after one was lost (psycopg_pool's `pool_size` counts those too, so a pool
    whose connections an outage broke looks full)."""

    max_size: int
    in_use: int
    idle: int
    connecting: int
    waiting: int

    @property
    def full(self) -> bool:
        """Every connection the pool may open is in use: a wait for one that ran out is
        the pool's limit, not the database (which then leaves connections `connecting`,
        never `in_use`)."""
        return self.in_use >= self.max_size


class DatabasePoolExhausted(DatabaseError):
    """No connection of the pool came free within the wait while every one was in use:
    the database answers, this process asks more of it at once than
    DATABASE_POOL_MAX_SIZE allows. Worth trying again shortly; not an outage."""

    def __init__(self, message: str, figures: PoolFigures) -> None:
        super().__init__(message)
        self.figures = figures


@cache
def queries() -> dict[str, str]:
    """Every named query of arm_core/queries.sql, loaded once."""
    text = resources.files("arm_core").joinpath("queries.sql").read_text(encoding="utf-8")
    chunks = _NAME.split(text)
    return {name: body.strip() for name, body in zip(chunks[1::2], chunks[2::2], strict=True)}


def query(name: str) -> str:
    return queries()[name]


log = logging.getLogger(__name__)


# What every connection of the runtime gets unless DATABASE_URL says otherwise: a
# connection attempt to a host that does not answer gives up after connect_timeout
# seconds (per host of a multi-host URL) instead of the kernel's minutes; a peer that
# died without closing its sockets (a machine lost, a network cut) is found by TCP
# keepalives on an idle connection (10 s, then 3 probes 5 s apart) and, while a query or
# its COMMIT is unacknowledged, by tcp_user_timeout (30 s) instead of the kernel's ~15
# minutes of retransmissions; either way a query does not wait forever on a dead host.
CONNECTION_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}


def connection_options(database_url: str, *, idle_in_transaction: float) -> dict[str, str]:
    """CONNECTION_DEFAULTS without those `database_url` sets itself; and, unless 0,
    `idle_in_transaction` seconds as libpq's `options`' idle_in_transaction_session_timeout
    (docs/dbas.md "Connections and dead clients"). The options the URL gives (or else
    PGOPTIONS, which libpq reads only when a connection string has none) are kept ahead
    of it; when they set the timeout themselves, they are left as they are."""
    given = conninfo_to_dict(database_url)
    found = {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in given}
    options = str(given["options"]) if "options" in given else os.environ.get("PGOPTIONS", "")
    if idle_in_transaction > 0 and not _IDLE_IN_TRANSACTION_SET.search(options):
        milliseconds = max(1, math.ceil(idle_in_transaction * 1000))
        setting = f"-c idle_in_transaction_session_timeout={milliseconds}"
        found["options"] = f"{options} {setting}" if options.strip() else setting
    return found


# The setting in libpq's options (`-c name=value`, `-cname=value` or `--name=value`,
# dashes for underscores allowed).
_IDLE_IN_TRANSACTION_SET = re.compile(r"idle[-_]in[-_]transaction[-_]session[-_]timeout\s*=", re.I)


def read_only(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the server of `conn` takes no writes, from the parameters it reports on
    its own (PostgreSQL 14+): in hot standby, or read-only by default. No round trip."""
    status = conn.info.parameter_status
    return status("in_hot_standby") == "on" or status("default_transaction_read_only") == "on"


class Outage(Episode):
    """The database's unavailability as this process sees it, logged as one event."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(action="db_outage", log=log, clock=clock)

    def failed(self, cause: str) -> None:
        """A query or a connection attempt failed because the database is unavailable."""
        self.happened(
            "database unavailable: %s",
            "database still unavailable after %.0f s (%d failed attempts): %s",
            cause,
        )

    def available(self) -> None:
        """A query or a connection attempt succeeded: an outage, if any, has ended."""
        self.end("database available again after %.1f s (%d failed attempts)")


class PoolExhaustion(Episode):
    """Waits for a connection that ran out on a full pool, logged as one event like an
    outage (`action=db_pool_exhausted`, WARNING; INFO when a connection is had again);
    `total` counts every such wait of the process (arm_db_pool_exhausted_total)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(action="db_pool_exhausted", log=log, clock=clock)
        self.level, self.end_level = logging.WARNING, logging.INFO
        self.total = 0

    def exhausted(self, action: str, waited: float, figures: PoolFigures) -> DatabasePoolExhausted:
        """Counts and logs a wait that ran out on a full pool; returns the error to raise."""
        self.total += 1
        said = (
            f"{action}: no database connection within {waited:g} s: all {figures.max_size} "
            f"connections of the pool are in use ({figures.waiting} requests waiting); "
            f"raise DATABASE_POOL_MAX_SIZE (now {figures.max_size}) or find what holds them"
        )
        self.happened(
            "connection pool exhausted: %s",
            "connection pool still exhausted after %.0f s (%d waits ran out): %s",
            said,
            in_use=figures.in_use,
            max=figures.max_size,
            waiting=figures.waiting,
        )
        return DatabasePoolExhausted(said, figures)

    def relieved(self) -> None:
        """A connection was had: an exhaustion, if any, has ended."""
        self.end("connection pool has connections to give again after %.1f s (%d waits ran out)")


class _PoolLog(logging.Filter):
    """psycopg_pool logs a warning for every failed connection attempt (several a second
    during an outage, each naming every host of a multi-host URL) and for every broken
    connection it discards: the first kind, for the pool named `pool`, goes to `outage`
    instead; the second is left out while an outage is logged anyway."""

    def __init__(self, pool: str, outage: Outage) -> None:
        super().__init__()
        self.pool, self.outage = pool, outage

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if message.startswith(("error connecting", "reconnection attempt")):
            args = record.args if isinstance(record.args, tuple) else ()
            if not args or args[0] != self.pool:
                return True  # another pool's: its own filter decides
            self.outage.failed(mask_urls_in(message))
            return False
        return not (message.startswith("discarding ") and self.outage.since is not None)


def unclaimed_pool_name(base: str = "arm-core") -> str:
    """`base`, or `base-2`, `base-3`, … when a pool of this process already has its
    failures routed under that name (pool_log_to): a process has one pool, a test process
    may hold several, and each must be told apart."""
    pool_log = logging.getLogger("psycopg.pool")
    taken = {f.pool for f in pool_log.filters if isinstance(f, _PoolLog)}
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    return name


@contextlib.contextmanager
def pool_log_to(pool: str, outage: Outage) -> Iterator[None]:
    """While inside, psycopg_pool's connection failures of the pool named `pool` go to
    `outage` (one event) instead of one warning per attempt."""
    pool_log = logging.getLogger("psycopg.pool")
    routed = _PoolLog(pool, outage)
    pool_log.addFilter(routed)
    try:
        yield
    finally:
        pool_log.removeFilter(routed)


# Errors that say "try again" rather than "this input is wrong": serialization failure,
# deadlock detected, lock not available. psycopg makes them OperationalErrors too, but the
# server answered: no outage.
_TRANSIENT = {"40001", "40P01", "55P03"}


@contextlib.contextmanager
def wrap_db_errors(action: str, outage: Outage) -> Iterator[None]:
    """Translates psycopg errors raised inside into the project's own, naming the action;
    tells `outage` whether the database answered."""
    try:
        yield
    except psycopg.Error as exc:
        # libpq may quote the connection string it could not use: never its password.
        said = mask_urls_in(str(exc))
        if exc.sqlstate in _TRANSIENT:
            outage.available()
            raise DatabaseConflict(f"{action}: {said}") from exc
        # The server unreachable; a read-only one counts (a standby, or a primary being
        # demoted, while the writable one is elsewhere: a failover in progress).
        closed = isinstance(exc, psycopg.InterfaceError) and "closed" in str(exc)
        if closed or isinstance(exc, psycopg.OperationalError | ReadOnlySqlTransaction):
            outage.failed(f"{action}: {said}")
            raise DatabaseUnavailable(f"{action}: database unavailable: {said}") from exc
        outage.available()
        raise DatabaseError(f"{action}: {said}") from exc
    outage.available()
