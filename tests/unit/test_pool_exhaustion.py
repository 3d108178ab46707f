"""Waits for a connection that ran out while every connection of the pool was in use
are one event in the log, like an outage: started once with the figures, repeated at
most every PoolExhaustion.report_every seconds, ended once a connection is had — and
never logged as an outage. PoolFigures.full is what tells the two apart."""

from __future__ import annotations

import logging

import pytest

from arm_core.db import DatabasePoolExhausted, DatabaseUnavailable, PoolExhaustion, PoolFigures

FULL = PoolFigures(max_size=4, in_use=4, idle=0, connecting=0, waiting=3)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def records(caplog: pytest.LogCaptureFixture, action: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == action]


def test_an_exhausted_pool_is_logged_once_at_a_bounded_rate_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    exhaustion = PoolExhaustion(clock)
    caplog.set_level(logging.INFO, logger="arm_core.db")
    exhaustion.relieved()  # nothing to end
    errors = []
    for _ in range(100):  # many requests a second, for 29 s
        errors.append(exhaustion.exhausted("get_file", 5.0, FULL))
        clock.now += 0.29
    [started] = records(caplog, "db_pool_exhausted")
    assert started.levelno == logging.WARNING
    fields = {k: vars(started)[k] for k in ("state", "in_use", "max", "waiting")}
    assert fields == {"state": "started", "in_use": 4, "max": 4, "waiting": 3}
    assert "DATABASE_POOL_MAX_SIZE (now 4)" in started.getMessage()
    assert "all 4 connections of the pool are in use (3 requests waiting)" in started.getMessage()
    clock.now += 2  # 31 s after the start
    exhaustion.exhausted("get_file", 5.0, FULL)
    exhaustion.exhausted("get_file", 5.0, FULL)
    ongoing = records(caplog, "db_pool_exhausted")[1:]
    assert [r.state for r in ongoing] == ["ongoing"]  # type: ignore[attr-defined]
    assert ongoing[0].getMessage().startswith("connection pool still exhausted after 31 s (101 ")
    exhaustion.relieved()
    exhaustion.relieved()
    ended = records(caplog, "db_pool_exhausted")[2:]
    assert [r.state for r in ended] == ["ended"]  # type: ignore[attr-defined]
    assert ended[0].count == 102  # type: ignore[attr-defined]
    assert exhaustion.total == 102
    assert not records(caplog, "db_outage")
    error = errors[0]
    assert isinstance(error, DatabasePoolExhausted) and not isinstance(error, DatabaseUnavailable)
    assert error.figures == FULL
    assert str(error).startswith("get_file: no database connection within 5 s: ")


def test_a_pool_is_full_only_when_every_connection_is_in_use() -> None:
    """psycopg_pool's pool_size counts the connections it is opening again after an
    outage broke them: those are `connecting`, and a pool of them is not exhausted."""
    assert FULL.full
    broken = PoolFigures(max_size=4, in_use=0, idle=0, connecting=4, waiting=2)
    assert not broken.full
    assert not PoolFigures(max_size=4, in_use=3, idle=0, connecting=1, waiting=1).full
