"""Database access: the named queries of queries.sql and one boundary for driver errors.

Python never writes the job tables itself; every query here calls a function of
db/functions. The runtime sends them only through arm_core.store, which types their
parameters and rows; query(name) is for the store (and for tests that run a query as
it is). Driver errors become :class:`DatabaseUnavailable` (the server cannot be reached;
retrying later makes sense) or :class:`DatabaseError` (anything else).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources

import psycopg

from arm_core.redaction import mask_urls_in

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


class DatabaseError(Exception):
    """A database call failed for a reason other than the server being unreachable."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached right now (connection refused, lost, timed out)."""


@cache
def queries() -> dict[str, str]:
    """Every named query of arm_core/queries.sql, loaded once."""
    text = resources.files("arm_core").joinpath("queries.sql").read_text(encoding="utf-8")
    chunks = _NAME.split(text)
    found = {name: body.strip() for name, body in zip(chunks[1::2], chunks[2::2], strict=True)}
    if not found:
        raise RuntimeError("arm_core/queries.sql holds no named queries")
    return found


def query(name: str) -> str:
    try:
        return queries()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in arm_core/queries.sql") from None


def is_unavailable(exc: BaseException) -> bool:
    """Whether a psycopg error means the server is unreachable (worth waiting for)."""
    return isinstance(
        exc,
        psycopg.OperationalError | psycopg.errors.AdminShutdown | psycopg.errors.CannotConnectNow,
    ) or (isinstance(exc, psycopg.InterfaceError) and "closed" in str(exc))


# Errors that say "try again" rather than "this input is wrong": serialization failure,
# deadlock detected, lock not available.
_TRANSIENT = {"40001", "40P01", "55P03"}


def is_transient(exc: BaseException) -> bool:
    """Whether a DatabaseError came from a conflict that a second try may not meet."""
    cause = exc.__cause__ if isinstance(exc, DatabaseError) else exc
    return isinstance(cause, psycopg.Error) and cause.sqlstate in _TRANSIENT


@contextlib.contextmanager
def wrap_db_errors(action: str) -> Iterator[None]:
    """Translates psycopg errors raised inside into the project's own, naming the action."""
    try:
        yield
    except psycopg.Error as exc:
        # libpq may quote the connection string it could not use: never its password.
        said = mask_urls_in(str(exc))
        if is_unavailable(exc):
            raise DatabaseUnavailable(f"{action}: database unavailable: {said}") from exc
        raise DatabaseError(f"{action}: {said}") from exc
