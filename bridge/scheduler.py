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
from collections.abc import Callable
from dataclasses import dataclass, field

from arm_core.bridge import events
from arm_core.bridge.config import SchedulerConfig
from arm_core.bridge.service import Service
from arm_core.db import DatabaseError, DatabaseUnavailable
from arm_core.instruments import Metrics
from arm_core.rows import BridgeInstance, TaskRun
from arm_core.store import Store

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Scheduler(Service):
    config: SchedulerConfig
    store: Store
    counts: events.Counts = field(default_factory=events.Counts)
    # The process's counters (arm_core.instruments); a service made alone has its own.
    metrics: Metrics = field(default_factory=Metrics)
    name = "schedule"
    _compacted_at: float = float("-inf")
    # The bridge's state for its row of arm.bridge_instance (None: no row is written).
    report: Callable[[], BridgeInstance] | None = None
    _waits_recorded_at: float = float("-inf")
    _beat_at: float = float("-inf")
    _settings_applied: bool = False

    async def apply_settings(self) -> None:
        """TIMEOUT_SWEEP_SECONDS, when given, sets the sweep's period in arm.periodic_task;
        otherwise the period a DBA set there stands."""
        if self.config.sweep_interval_seconds is not None:
            await self.store.set_sweep_interval(self.config.sweep_interval_seconds)
        self._settings_applied = True

    async def run_once(self) -> list[TaskRun]:
        """One tick: runs every task that is due now, records each, returns them (none
        when nothing was due or another caller holds them). Raises DatabaseError.

        The first tick that reaches the database applies the settings first, so start-up
        never waits for a database that is down, and the period is set once it is up."""
        if not self._settings_applied:
            await self.apply_settings()
        ran = await self.store.run_due_tasks()
        for task in ran:
            events.task_ran(self, task)
        await self.compact_counts()
        await self.record_waits()
        await self.record_bridge()
        return ran

    async def compact_counts(self, force: bool = False) -> int | None:
        """Folds the per-status count deltas (arm_jobs, the status view) when the last
        fold is compact_every_seconds old, or `force`; returns how many rows it folded
        (None when not due). A failure is logged; the next tick tries again."""
        now = time.monotonic()
        if not force and now - self._compacted_at < self.config.compact_every_seconds:
            return None
        self._compacted_at = now
        try:
            return await self.store.compact_counts()
        except DatabaseError as exc:
            level = logging.DEBUG if isinstance(exc, DatabaseUnavailable) else logging.WARNING
            log.log(level, "compact_counts failed: %s", exc, extra={"action": "schedule"})
            return None

    async def record_waits(self, force: bool = False) -> dict[str, list[int]] | None:
        """Hands the waits the process observed (its metrics' tally) since the last time
        to arm.record_waits (the console's wait chart) when that was wait_sample_seconds
        ago, or `force`; returns what it stored (None when not due). On a failure the
        counts are kept for the next time, and it is logged like a failed fold."""
        now = time.monotonic()
        if not force and now - self._waits_recorded_at < self.config.wait_sample_seconds:
            return None
        self._waits_recorded_at = now
        taken = self.metrics.waits.take()
        if not taken:
            return {}
        try:
            await self.store.record_waits(taken)
        except DatabaseError as exc:
            self.metrics.waits.give_back(taken)
            level = logging.DEBUG if isinstance(exc, DatabaseUnavailable) else logging.WARNING
            log.log(level, "record_waits failed: %s", exc, extra={"action": "schedule"})
            return None
        return taken

    async def record_bridge(self, force: bool = False) -> BridgeInstance | None:
        """Writes the bridge's row of arm.bridge_instance when the last write is
        heartbeat_seconds old, or `force`; returns what it wrote (None when not due or
        there is no report). A failure is logged like a failed fold."""
        now = time.monotonic()
        if self.report is None or (
            not force and now - self._beat_at < self.config.heartbeat_seconds
        ):
            return None
        self._beat_at = now
        state = self.report()
        try:
            await self.store.record_bridge(state)
        except DatabaseError as exc:
            level = logging.DEBUG if isinstance(exc, DatabaseUnavailable) else logging.WARNING
            log.log(level, "record_bridge failed: %s", exc, extra={"action": "schedule"})
            return None
        return state

    async def run(self, stopping: asyncio.Event) -> None:
        """Ticks every SCHEDULE_TICK_SECONDS until `stopping` is set."""
        while not stopping.is_set():
            self.beat()
            try:
                await self.run_once()
            except DatabaseError as exc:
                # An unavailable database is logged once as an outage (arm_core.db).
                level = logging.DEBUG if isinstance(exc, DatabaseUnavailable) else logging.WARNING
                log.log(level, "schedule tick failed: %s", exc, extra={"action": "schedule"})
            try:
                await asyncio.wait_for(stopping.wait(), self.config.settings.schedule_tick_seconds)
            except TimeoutError:
                pass
