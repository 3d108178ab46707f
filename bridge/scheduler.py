"""Calls arm.run_due_tasks() every SCHEDULE_TICK_SECONDS (R-TO-1). The database decides
what is due and locks each task while it runs, so any number of bridge instances (and
pg_cron) can tick at once and a task still runs once per period."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from arm_core.bridge import events
from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.service import Service, stopped_within
from arm_core.db import DatabaseError, DatabaseUnavailable
from arm_core.instruments import Metrics
from arm_core.rows import BridgeInstance, TaskRun
from arm_core.store import Store

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Scheduler(Service):
    config: BridgeConfig
    store: Store
    counts: events.Counts = field(default_factory=events.Counts)
    # The process's counters (arm_core.instruments); a service made alone has its own.
    metrics: Metrics = field(default_factory=Metrics)
    name = "schedule"
    # The bridge's state for its row of arm.bridge_instance (None: no row is written).
    report: Callable[[], BridgeInstance] | None = None
    _settings_applied: bool = False
    # When each of the steps that run at most every so often last ran.
    _ran_at: dict[str, float] = field(default_factory=dict)

    async def run_once(self) -> list[TaskRun]:
        """One tick: runs every task that is due now, records each, returns them (none
        when nothing was due or another caller holds them). Raises DatabaseError."""
        s = self.config.settings
        # The first tick that reaches the database applies the settings, so start-up never
        # waits for a database that is down. TIMEOUT_SWEEP_SECONDS, when given, sets the
        # sweep's period in arm.periodic_task; otherwise the period a DBA set there stands.
        if not self._settings_applied:
            if "TIMEOUT_SWEEP_SECONDS" in s.explicit:
                await self.store.set_sweep_interval(s.timeout_sweep_seconds)
            self._settings_applied = True
        ran = await self.store.run_due_tasks()
        for task in ran:
            events.task_ran(self, task)
        c = self.config
        # The per-status count deltas (arm_jobs, the status view) folded.
        if self._due("compact_counts", c.compact_every_seconds):
            await _logged("compact_counts", self.store.compact_counts())
        await self.record_waits()
        if self.report is not None and self._due("record_bridge", c.heartbeat_seconds):
            await _logged("record_bridge", self.store.record_bridge(self.report()))
        return ran

    def _due(self, step: str, period: float, force: bool = False) -> bool:
        now = time.monotonic()
        if not force and now - self._ran_at.get(step, float("-inf")) < period:
            return False
        self._ran_at[step] = now
        return True

    async def record_waits(self, force: bool = False) -> dict[str, list[int]] | None:
        """Hands the waits the process observed (its metrics' tally) since the last time
        to arm.record_waits (the console's wait chart) when that was wait_sample_seconds
        ago, or `force`; returns what it stored (None when not due or it failed: then the
        counts are kept for the next time)."""
        if not self._due("record_waits", self.config.wait_sample_seconds, force):
            return None
        taken = self.metrics.waits.take()
        if taken and not await _logged("record_waits", self.store.record_waits(taken)):
            self.metrics.waits.give_back(taken)
            return None
        return taken

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self.beat()
            await _logged("schedule tick", self.run_once())
            await stopped_within(stopping, self.config.settings.schedule_tick_seconds)


async def _logged(step: str, call: Awaitable[object]) -> bool:
    """Awaits `call`; a DatabaseError is logged (the next tick tries again) and False. An
    unavailable database is logged once as an outage (arm_core.db), so here at DEBUG."""
    try:
        await call
    except DatabaseError as exc:
        level = logging.DEBUG if isinstance(exc, DatabaseUnavailable) else logging.WARNING
        log.log(level, "%s failed: %s", step, exc, extra={"action": "schedule"})
        return False
    return True
