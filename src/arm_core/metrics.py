"""Prometheus metrics: what `GET /metrics` of `arm-core serve` and of the bridge's
health port answers (docs/logs-and-metrics.md "Metrics" lists every name, label and
meaning). The process's counters are arm_core.instruments.Metrics; :class:`AppMetrics`
adds the gauges read at scrape time: the bridge's and the pool's from memory, the
database's from one bounded read, cached (a failed read leaves them out and sets
`arm_database_up` to 0; everything else is still there).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from arm_core.config import Settings
from arm_core.config_error import ConfigError
from arm_core.db import DatabaseError, DatabasePoolExhausted
from arm_core.instruments import Instruments
from arm_core.rows import BridgeInstance, PaceRow, SeriesPoint, StatusView
from arm_core.statuses import JobStatus
from arm_core.store import Store
from arm_core.tls import expires_at

log = logging.getLogger(__name__)


@dataclass
class BridgeState:
    """What a running bridge says about itself (bridge/runner.py Bridge.metrics_state)."""

    nats_connected: bool
    inbox_buffered: int
    # RESULTS_STREAM: answers waiting in the stream as its last fetch saw them (None:
    # no stream, or no fetch yet).
    stream_pending: int | None = None


@dataclass(eq=False)  # a collector is registered: hashed by identity
class AppMetrics(Collector):
    """The gauges of one application, and the reads GET /api/v1/status shares. `store`
    and `bridge` are looked up when read (the pool opens after the app is built; the
    bridge may be off)."""

    store: Callable[[], Store]
    bridge: Callable[[], BridgeState | None]
    # The process's counters (exposed first) and its count of exhausted waits.
    instruments: Instruments = field(default_factory=Instruments)
    # ACK_TIMEOUT_SECONDS: a published job older than this without an ack is overdue.
    ack_timeout: float = 30.0
    # How long a scrape (or a status poll) may wait for each read of the database, and
    # how long a scrape's read (or its failure) is reused.
    timeout: float = 1.0
    cache_seconds: float = 5.0
    # GET /api/v1/status is polled by consoles every few seconds: one read serves them all.
    status_cache_seconds: float = 2.0
    # When each certificate file this process read at start expires first, by the
    # variable naming it (Unix time): files are read once, so this is what it serves.
    certificates: dict[str, float] = field(default_factory=dict)
    # The database's gauges: the status view, the pacing and the oldest ready job's age.
    _figures: tuple[StatusView, list[PaceRow], float] | None = None
    # Each read's last result by its name: when, for which argument, what it gave.
    _cache: dict[str, tuple[float, object, Any]] = field(default_factory=dict)
    _locks: defaultdict[str, asyncio.Lock] = field(
        default_factory=lambda: defaultdict(asyncio.Lock)
    )

    async def _cached(
        self, name: str, arg: object, seconds: float, read: Callable[[], Awaitable[Any]]
    ) -> Any:
        """What read() gave less than `seconds` ago for `arg`, else read() again (one at
        a time per name: the polls waiting meanwhile get its result)."""
        async with self._locks[name]:
            hit = self._cache.get(name)
            if hit is not None and hit[1] == arg and time.monotonic() - hit[0] < seconds:
                return hit[2]
            value = await read()
            self._cache[name] = (time.monotonic(), arg, value)
            return value

    async def status_view(self) -> tuple[StatusView, list[BridgeInstance], list[PaceRow]]:
        """What GET /api/v1/status shows, shared for status_cache_seconds; may raise."""

        async def read() -> tuple[StatusView, list[BridgeInstance], list[PaceRow]]:
            store = self.store()
            return (
                await store.status_view(self.ack_timeout, within=self.timeout),
                await store.bridge_instances(within=self.timeout),
                await store.pace_view(within=self.timeout),
            )

        return await self._cached("status", None, self.status_cache_seconds, read)

    async def status_series(self, minutes: int) -> list[SeriesPoint]:
        """What GET /api/v1/status/series shows, shared like the status view."""
        read = partial(self.store().status_series, minutes, within=self.timeout)
        return await self._cached("series", minutes, self.status_cache_seconds, read)

    async def _read_figures(self) -> tuple[StatusView, list[PaceRow], float] | None:
        """The database's gauges, or None (logged) when the read fails or takes longer
        than `timeout`."""
        store = self.store()
        try:
            view = await store.status_view(self.ack_timeout, within=self.timeout)
            pacing = await store.pace_view(within=self.timeout)
            async with asyncio.timeout(self.timeout):
                return view, pacing, await store.outbox_ready_age(self.timeout)
        except (DatabaseError, TimeoutError) as exc:
            busy = isinstance(exc, DatabasePoolExhausted)
            log.warning(
                "metrics: the database's gauges are left out: %s",
                exc,
                extra={
                    "action": "metrics",
                    "reason": "pool_exhausted" if busy else "database_unavailable",
                },
            )
            return None

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "arm_database_up",
            "1 when the last read of the database's gauges (arm_jobs, "
            "arm_outbox_oldest_queued_age_seconds) succeeded; 0 and those gauges left out "
            "when it failed or took longer than 1 s",
            value=1 if self._figures is not None else 0,
        )
        if self._figures is not None:
            view, pacing, ready_age = self._figures
            jobs = GaugeMetricFamily("arm_jobs", "Recognition jobs per status", labels=["status"])
            for status in JobStatus:
                jobs.add_metric([status.value], view.jobs.get(status.value, 0))
            yield jobs
            yield GaugeMetricFamily(
                "arm_outbox_oldest_queued_age_seconds",
                "Seconds the oldest queued job has waited to be published (0 when none)",
                value=view.oldest_queued_age_seconds,
            )
            yield GaugeMetricFamily(
                "arm_outbox_oldest_ready_age_seconds",
                "Seconds the oldest queued job that pacing does not hold back has waited to "
                "be published (0 when none): what a stuck publisher leaves waiting",
                value=ready_age,
            )
            yield GaugeMetricFamily(
                "arm_jobs_unacked_overdue",
                "Published jobs without an ack for longer than ACK_TIMEOUT_SECONDS",
                value=view.unacked_overdue,
            )
            yield GaugeMetricFamily(
                "arm_jobs_past_deadline_unswept",
                "Published or processing jobs past their reply deadline that no sweep has "
                "timed out yet",
                value=view.past_deadline_unswept,
            )
            yield from _pacing(pacing)
            if view.last_sweep_at is not None:
                yield GaugeMetricFamily(
                    "arm_schedule_last_sweep_timestamp_seconds",
                    "When the timeout sweep last ran (Unix time; absent before its first run)",
                    value=view.last_sweep_at.timestamp(),
                )
                yield GaugeMetricFamily(
                    "arm_schedule_last_sweep_ok",
                    "1 when the timeout sweep's last run succeeded, 0 when it failed",
                    value=1 if view.last_sweep_error is None else 0,
                )
        yield CounterMetricFamily(
            "arm_db_pool_exhausted",
            "Waits for a database connection that ran out while every connection of the "
            "pool was in use (DATABASE_POOL_MAX_SIZE reached; not an outage)",
            value=self.instruments.pool_exhaustion.total,
        )
        pool = self.store().pool_figures
        connections = GaugeMetricFamily(
            "arm_db_pool_connections",
            "Connections of this process's pool: in_use (taken by a request or a "
            "loop), idle (ready), connecting (being opened, or opened again after one "
            "was lost)",
            labels=["state"],
        )
        connections.add_metric(["in_use"], pool.in_use)
        connections.add_metric(["idle"], pool.idle)
        connections.add_metric(["connecting"], pool.connecting)
        yield connections
        yield GaugeMetricFamily(
            "arm_db_pool_max",
            "The most connections this process's pool opens (DATABASE_POOL_MAX_SIZE)",
            value=pool.max_size,
        )
        yield GaugeMetricFamily(
            "arm_db_pool_requests_waiting",
            "Requests waiting for a connection of this process's pool",
            value=pool.waiting,
        )
        if self.certificates:
            expiry = GaugeMetricFamily(
                "arm_tls_certificate_expiry_timestamp_seconds",
                "When the first certificate of a file this process read at start expires "
                "(Unix time), by the variable naming the file; a new file takes a restart",
                labels=["variable"],
            )
            for variable, at in sorted(self.certificates.items()):
                expiry.add_metric([variable], at)
            yield expiry
        state = self.bridge()
        if state is not None:
            yield GaugeMetricFamily(
                "arm_nats_connected",
                "1 while this process's bridge is connected to NATS and subscribed",
                value=1 if state.nats_connected else 0,
            )
            yield GaugeMetricFamily(
                "arm_inbox_buffered",
                "Envelopes received and not applied yet: in this process's inbox buffers, or "
                "in a worker's batch held while the database is away",
                value=state.inbox_buffered,
            )
            if state.stream_pending is not None:
                yield GaugeMetricFamily(
                    "arm_results_stream_pending",
                    "With RESULTS_STREAM: answers waiting in the stream for the bridges' "
                    "durable consumer, as this bridge's last fetch saw them (0 when a "
                    "fetch found none)",
                    value=state.stream_pending,
                )

    async def exposition(self) -> bytes:
        """The whole text of GET /metrics: this process's counters, then these gauges."""
        self._figures = await self._cached("figures", None, self.cache_seconds, self._read_figures)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(self.instruments.metrics.registry) + generate_latest(registry)


def certificate_expiries(settings: Settings) -> dict[str, float]:
    """When each certificate file expires first. One DATABASE_URL names is libpq's to
    judge: when it cannot be read it is left out, and logged (the others were checked
    at start)."""
    found: dict[str, float] = {}
    for variable, path in settings.certificate_files().items():
        try:
            found[variable] = expires_at(variable, path).timestamp()
        except ConfigError as exc:
            log.warning("no expiry metric for %s", exc, extra={"action": "metrics"})
    return found


def _pacing(rows: list[PaceRow]) -> Iterable[Metric]:
    """Each pipeline's pacing (docs/pacing.md), from arm.pace_view."""
    gauges = {
        "limit": GaugeMetricFamily(
            "arm_pipeline_in_flight_limit",
            "How many jobs of the pipeline its service may hold at once (absent with PACING=off)",
            labels=["pipeline"],
        ),
        "in_flight": GaugeMetricFamily(
            "arm_pipeline_in_flight",
            "Jobs of the pipeline in its service's hands (published or processing)",
            labels=["pipeline"],
        ),
        "held_back": GaugeMetricFamily(
            "arm_pipeline_held_back",
            "Queued jobs of the pipeline the limit keeps back now (all of them while its "
            "service is not answering)",
            labels=["pipeline"],
        ),
        "answering": GaugeMetricFamily(
            "arm_pipeline_answering",
            "0 from an ack timeout with nothing heard from the pipeline's service until "
            "its next ack or answer; 1 otherwise",
            labels=["pipeline"],
        ),
    }
    for row in rows:
        if row.in_flight_limit is not None:
            gauges["limit"].add_metric([row.pipeline], row.in_flight_limit)
        gauges["in_flight"].add_metric([row.pipeline], row.in_flight)
        gauges["held_back"].add_metric([row.pipeline], row.held_back)
        gauges["answering"].add_metric([row.pipeline], 1 if row.answering else 0)
    yield from gauges.values()
