"""What a statement's plans say, from inside the functions it calls: auto_explain logs
the plan of every statement a call runs (nested ones included, with actual row counts),
sent to this client as notices. The scan-bound tests and the paced claim's benchmark
read them."""

from __future__ import annotations

import json
from typing import Any

import psycopg

AUTO_EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_buffers = on",
    "SET auto_explain.log_timing = off",
    "SET auto_explain.log_format = json",
    "SET auto_explain.log_level = notice",
)


def explained(
    url: str, sql: str, params: dict[str, Any] | None = None, setup: tuple[str, ...] = ()
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Runs sql (rolled back afterwards, with the `setup` statements before it) under
    auto_explain; returns its rows and the plan of every statement it ran, in the order
    they ended: the functions' own statements first, the outermost last (whose buffers
    count those of every statement run under it)."""
    notices: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in AUTO_EXPLAIN:
            conn.execute(setting)
        with conn.transaction(force_rollback=True):
            for statement in setup:
                conn.execute(statement)
            conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
            rows = conn.execute(sql, params).fetchall()
    plans = [json.loads(n.split("plan:", 1)[1])["Plan"] for n in notices if "plan:" in n]
    assert plans, "auto_explain logged nothing"
    return rows, plans


def buffers(plan: dict[str, Any]) -> int:
    """Shared blocks a plan's statement touched: hit + read."""
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
