"""Calls arm.run_due_tasks() every SCHEDULE_TICK_SECONDS (R-TO-1 scheduling).

The database decides what is due and locks each task while it runs, so any number of
bridge instances (and pg_cron) can tick at once and a task still runs once per period.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from arm_core.config import Settings
from arm_core.db import DatabaseError, query, wrap_db_errors

log = logging.getLogger(__name__)


async def apply_schedule_settings(settings: Settings, pool: AsyncConnectionPool[Any]) -> None:
    """TIMEOUT_SWEEP_SECONDS, when given, sets the sweep's period in arm.periodic_task;
    otherwise the period a DBA set there stands."""
    if "TIMEOUT_SWEEP_SECONDS" not in settings.explicit:
        return
    with wrap_db_errors("set_sweep_interval"):
        async with pool.connection() as conn:
            await conn.execute(
                query("set_sweep_interval"), {"seconds": settings.timeout_sweep_seconds}
            )


async def run_schedule(
    settings: Settings, pool: AsyncConnectionPool[Any], stopping: asyncio.Event
) -> None:
    while not stopping.is_set():
        try:
            with wrap_db_errors("run_due_tasks"):
                async with pool.connection() as conn:
                    cur = conn.cursor(row_factory=dict_row)
                    await cur.execute(query("run_due_tasks"))
                    ran = await cur.fetchall()
            for task in ran:
                if task["error"]:
                    log.error(
                        "periodic task %s failed: %s",
                        task["task"],
                        task["error"],
                        extra={"action": "schedule", "error": task["error"]},
                    )
                elif task["result"] not in (None, "0"):
                    log.info(
                        "periodic task %s: %s",
                        task["task"],
                        task["result"],
                        extra={"action": "schedule", "count": task["result"]},
                    )
        except DatabaseError as exc:
            log.warning("schedule tick failed: %s", exc, extra={"action": "schedule"})
        try:
            await asyncio.wait_for(stopping.wait(), settings.schedule_tick_seconds)
        except TimeoutError:
            pass
