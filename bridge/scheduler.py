"""Calls arm.run_due_tasks() every SCHEDULE_TICK_SECONDS (R-TO-1 scheduling).

The database decides what is due and locks each task while it runs, so any number of
bridge instances (and pg_cron) can tick at once and a task still runs once per period.
One tick is one step, :meth:`Scheduler.run_once`, which returns the tasks that ran; the
loop calls it, and so can a test.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from psycopg_pool import AsyncConnectionPool

from arm_core import metrics
from arm_core.config import Settings
from arm_core.db import DatabaseError
from arm_core.store import Store, TaskRun

log = logging.getLogger(__name__)


@dataclass
class Scheduler:
    settings: Settings
    pool: AsyncConnectionPool[Any]
    store: Store = field(init=False)
    # The per-status counts' deltas are folded at most this often (arm.compact_counts).
    compact_every_seconds: float = 5.0
    _compacted_at: float = float("-inf")

    def __post_init__(self) -> None:
        self.store = Store(self.pool)

    async def apply_settings(self) -> None:
        """TIMEOUT_SWEEP_SECONDS, when given, sets the sweep's period in arm.periodic_task;
        otherwise the period a DBA set there stands."""
        if "TIMEOUT_SWEEP_SECONDS" not in self.settings.explicit:
            return
        await self.store.set_sweep_interval(self.settings.timeout_sweep_seconds)

    async def run_once(self) -> list[TaskRun]:
        """One tick: runs every task that is due now, logs each, returns them (none when
        nothing was due or another caller holds them). Raises DatabaseError."""
        ran = await self.store.run_due_tasks()
        for task in ran:
            if task.task == "sweep_timeouts" and task.result and task.result.isdigit():
                metrics.transition("timeout", int(task.result))
            if task.error:
                log.error(
                    "periodic task %s failed: %s",
                    task.task,
                    task.error,
                    extra={"action": "schedule", "error": task.error},
                )
            elif task.result not in (None, "0"):
                log.info(
                    "periodic task %s: %s",
                    task.task,
                    task.result,
                    extra={"action": "schedule", "count": task.result},
                )
        await self.compact_counts()
        return ran

    async def compact_counts(self, force: bool = False) -> int | None:
        """Folds the per-status count deltas (arm_jobs, the status view) when the last
        fold is compact_every_seconds old, or `force`; returns how many rows it folded
        (None when not due). A failure is logged; the next tick tries again."""
        now = time.monotonic()
        if not force and now - self._compacted_at < self.compact_every_seconds:
            return None
        self._compacted_at = now
        try:
            return await self.store.compact_counts()
        except DatabaseError as exc:
            log.warning("compact_counts failed: %s", exc, extra={"action": "schedule"})
            return None

    async def run(self, stopping: asyncio.Event) -> None:
        """Ticks every SCHEDULE_TICK_SECONDS until `stopping` is set."""
        while not stopping.is_set():
            try:
                await self.run_once()
            except DatabaseError as exc:
                log.warning("schedule tick failed: %s", exc, extra={"action": "schedule"})
            try:
                await asyncio.wait_for(stopping.wait(), self.settings.schedule_tick_seconds)
            except TimeoutError:
                pass
