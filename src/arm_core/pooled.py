"""How the store sends a query: a connection of the process's pool, typed rows, a bound
on the wait, driver errors translated (arm_core.db), a wait that ran out on a full pool
told apart from an outage, and a call a concurrent transaction rolled back sent again.
:class:`Pooled` is the store's base; every operation is arm_core.store's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import scalar_row
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from arm_core.db import (
    DatabaseConflict,
    DatabaseUnavailable,
    PoolFigures,
    query,
    wrap_db_errors,
)
from arm_core.instruments import Instruments
from arm_core.rows import typed_row

log = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")

# A call that a concurrent transaction rolled back (a deadlock, a serialization failure:
# DatabaseConflict) goes again this many times, after 50 ms, 100 ms, 150 ms. Every call
# of the store is one function call in one transaction, so nothing of the first try
# stays behind. Two multi-row writers can meet in opposite orders — a retry of many
# files and a batch of answers applied to some of the same files — and PostgreSQL then
# rolls one of them back; the second try finds the other committed.
CONFLICT_RETRIES = 3


class Pooled:
    """Sends named queries on `pool`, reporting to `instruments` (a fresh set when none
    is given)."""

    def __init__(
        self, pool: AsyncConnectionPool[Any], instruments: Instruments | None = None
    ) -> None:
        self.pool = pool
        self.instruments = instruments or Instruments()
        self._in_use = 0  # connections taken by _connection and not given back

    @property
    def pool_figures(self) -> PoolFigures:
        """The pool now (the gauges of /metrics): its max_size, the connections in use
        (this store's count), idle and being opened, and the requests waiting, from
        psycopg_pool's get_stats()."""
        stats = self.pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        return PoolFigures(
            max_size=self.pool.max_size,
            in_use=self._in_use,
            idle=idle,
            connecting=max(0, size - idle - self._in_use),
            waiting=stats.get("requests_waiting", 0),
        )

    async def _rows(
        self,
        conn: AsyncConnection[Any],
        name: str,
        row: type[R],
        params: dict[str, Any] | None = None,
        json_as_text: bool = False,
    ) -> list[R]:
        cur = conn.cursor(row_factory=typed_row(row))
        if json_as_text:  # a request goes out as PostgreSQL wrote it: no parse and re-dump
            cur.adapters.register_loader("jsonb", TextLoader)
        await cur.execute(query(name), params)
        return await cur.fetchall()

    async def _scalar(
        self, conn: AsyncConnection[Any], name: str, params: dict[str, Any] | None = None
    ) -> Any:
        cur = conn.cursor(row_factory=scalar_row)
        await cur.execute(query(name), params)
        return await cur.fetchone()

    @contextlib.asynccontextmanager
    async def _connection(
        self, action: str, pool_timeout: float | None = None
    ) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection of the pool, for `action`. One whose server refused a write as
        read-only (a standby, or a primary being demoted, at a failover) is closed, so the
        pool replaces it with one to the writable server instead of handing it out again.

        When none comes within `pool_timeout` (DATABASE_POOL_TIMEOUT_SECONDS by default)
        while every connection of the pool is in use, DatabasePoolExhausted (logged and
        counted by the instruments' PoolExhaustion); otherwise the pool could not connect, and its
        PoolTimeout goes on to wrap_db_errors, which reports the outage."""
        acquired = False
        try:
            async with self.pool.connection(timeout=pool_timeout) as conn:
                acquired = True
                self._in_use += 1
                self.instruments.pool_exhaustion.relieved()
                try:
                    yield conn
                except psycopg.errors.ReadOnlySqlTransaction:
                    await conn.close()
                    raise
                finally:
                    self._in_use -= 1
        except PoolTimeout as exc:
            figures = self.pool_figures
            if acquired or not figures.full:
                raise
            waited = self.pool.timeout if pool_timeout is None else pool_timeout
            raise self.instruments.pool_exhaustion.exhausted(action, waited, figures) from exc

    async def _pooled_rows(
        self, name: str, row: type[R], params: dict[str, Any] | None = None
    ) -> list[R]:
        async def call() -> list[R]:
            with wrap_db_errors(name, self.instruments.outage):
                async with self._connection(name) as conn:
                    return await self._rows(conn, name, row, params)

        return await self._again_on_conflict(name, call)

    async def _pooled_scalar(
        self, name: str, params: dict[str, Any] | None = None, pool_timeout: float | None = None
    ) -> Any:
        async def call() -> Any:
            with wrap_db_errors(name, self.instruments.outage):
                async with self._connection(name, pool_timeout) as conn:
                    return await self._scalar(conn, name, params)

        return await self._again_on_conflict(name, call)

    @staticmethod
    async def _again_on_conflict(name: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call`, again after a short pause when a concurrent transaction rolled it back,
        up to CONFLICT_RETRIES times; the last DatabaseConflict goes to the caller."""
        tries = 0
        while True:
            try:
                return await call()
            except DatabaseConflict as exc:
                if tries == CONFLICT_RETRIES:
                    raise
                tries += 1
                log.info(
                    "%s: trying again (%d of %d): %s",
                    name,
                    tries,
                    CONFLICT_RETRIES,
                    exc,
                    extra={"action": "db_conflict", "count": tries},
                )
                await asyncio.sleep(0.05 * tries)

    async def _bounded_rows(
        self, name: str, row: type[R], params: dict[str, Any] | None, within: float
    ) -> list[R]:
        """_pooled_rows within `within` seconds, the wait for a connection included (past
        it, as for any wait: DatabasePoolExhausted or DatabaseUnavailable); a statement
        still running at the deadline is cancelled (psycopg sends the server a cancel
        request) and DatabaseUnavailable raised."""
        deadline = asyncio.get_running_loop().time() + within
        with wrap_db_errors(name, self.instruments.outage):
            async with self._connection(name, within) as conn:
                try:
                    async with asyncio.timeout_at(deadline):
                        return await self._rows(conn, name, row, params)
                except TimeoutError as exc:
                    raise DatabaseUnavailable(f"{name}: no answer within {within:g} s") from exc
