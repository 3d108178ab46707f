"""What the tests that take a server away ask of it and of the processes: a count that
survives the server's absence, the jobs by status, an HTTP GET with a deadline
(tests/e2e/test_pg_restart.py, tests/e2e/test_pg_failover.py), and a port whose packets
vanish (iptables), as a peer does that is gone without closing its sockets."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg

from arm_core.devtools.embedded_postgres_host import pid_alive
from arm_core.devtools.testbed.sql import dict_conn


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


IPTABLES_MISSING = "iptables is not installed (Debian: apt-get install iptables)"


def iptables_missing() -> str | None:
    """Why black_hole cannot work here, or None: what a test skips with, and what a run
    of the fault schedules refuses to start with (rather than fail at its first packet
    drop, minutes in)."""
    return IPTABLES_MISSING if shutil.which("iptables") is None else None


def metric(port: int, name: str) -> float:
    """The sum of every series of `name` (a prefix: `name{…}` selects some) on the
    /metrics of the process whose health port is `port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


# Every rule black_hole adds carries this comment and the adding process's pid, so that
# rules a killed run left behind can be found and removed (clear_black_holes) without
# touching anyone else's, nor those of a run still going.
RULE_COMMENT = "arm-core-black-hole"
_RULE_OWNER = re.compile(rf'--comment "?{RULE_COMMENT}:(\d+)\b')


def _iptables(action: str, port: int) -> None:
    for direction in ("--dport", "--sport"):
        subprocess.run(
            ["iptables", action, "OUTPUT", "-o", "lo", "-p", "tcp", direction, str(port),
             "-m", "comment", "--comment", f"{RULE_COMMENT}:{os.getpid()}", "-j", "DROP"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip


@contextlib.contextmanager
def black_hole(port: int) -> Iterator[None]:
    """Every packet to and from `port` on loopback dropped: a peer that vanished (its
    machine lost, a network cut). The rules go at the end, whatever happens."""
    _iptables("-A", port)
    try:
        yield
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _iptables("-D", port)


def clear_black_holes() -> list[str]:
    """Remove the rules black_hole added in a run that was killed before it could (they
    would silence a port a later run picks): those whose adding process is gone. Returns
    the rules removed."""
    if iptables_missing():
        return []
    listed = subprocess.run(
        ["iptables", "-S", "OUTPUT"], check=True, capture_output=True, text=True, timeout=30
    ).stdout.splitlines()
    stale = [
        rule
        for rule in listed
        if (owner := _RULE_OWNER.search(rule)) is not None and not pid_alive(int(owner.group(1)))
    ]
    for rule in stale:
        # `-S` prints a rule as `-A OUTPUT …` (the comment quoted): the same words after
        # -D delete it.
        subprocess.run(
            ["iptables", "-D", *shlex.split(rule)[1:]],
            check=True,
            capture_output=True,
            timeout=30,
        )
    return stale
