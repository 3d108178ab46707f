"""What the tests that take a server away ask of it and of the processes: a count that
survives the server's absence, the jobs by status, and an HTTP GET with a deadline
(tests/e2e/test_pg_restart.py, tests/e2e/test_pg_failover.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import psycopg

from tests.support.sql import dict_conn


def count(url: str, sql: str) -> int:
    """A fresh connection each time: the server under test goes away and comes back
    (-1 while it, or every host of a multi-host URL that takes writes, is away)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(sql).fetchone()
    except psycopg.OperationalError:
        return -1
    assert row is not None
    return int(row[0])


def by_status(url: str) -> dict[str, int]:
    with dict_conn(url) as conn:
        rows = conn.execute(
            "SELECT status::text AS s, count(*) AS n FROM arm.recognition_job GROUP BY 1"
        ).fetchall()
    return {r["s"]: r["n"] for r in rows}


def http_get(url: str) -> tuple[int, dict[str, Any]]:
    """GET with a deadline: a hang fails the test as a timeout, not a pass."""
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
