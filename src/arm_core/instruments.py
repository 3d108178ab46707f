"""What a process observes about itself, on one object handed down instead of held in
module globals: its counters and histograms (:class:`Metrics`, with the wait tally the
console's chart is fed from), its database outage and its exhausted pool, each logged as
one event. `arm-core serve` and `arm-core bridge` make one :class:`Instruments` per
application (on its AppMetrics); a Store or service built without one gets its own."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

from arm_core.db import Outage, PoolExhaustion
from arm_core.statuses import ApplyOutcome

# Also the buckets of the console's wait chart: arm.wait_bucket_bounds() is the same list.
JOB_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

TRANSITIONS = ("published", "processing", "done", "needs_check", "error", "timeout", "dlq")
ENVELOPE_OUTCOMES = (
    *(o.value for o in ApplyOutcome if o is not ApplyOutcome.BUSY),
    "rejected",
    "dropped",
)
PHASES = ("queued", "ack", "processing")
RETRY_OUTCOMES = ("retried", "not_found", "not_retryable")


class WaitTally:
    """The waits since the schedule runner last took them for arm.record_waits, per phase
    and bucket of JOB_WAIT_BUCKETS (one more, last, above the highest): the histogram's
    observations, kept apart because this one is taken and reset."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}

    def add(self, phase: str, seconds: float) -> None:
        counts = self._counts.setdefault(phase, [0] * (len(JOB_WAIT_BUCKETS) + 1))
        counts[bisect.bisect_left(JOB_WAIT_BUCKETS, max(0.0, seconds))] += 1

    def take(self) -> dict[str, list[int]]:
        """What was counted since the last take, emptied."""
        taken, self._counts = self._counts, {}
        return taken

    def give_back(self, taken: dict[str, list[int]]) -> None:
        """Counts taken but not stored (the database failed): kept for the next take."""
        for phase, counts in taken.items():
            mine = self._counts.setdefault(phase, [0] * len(counts))
            self._counts[phase] = [a + b for a, b in zip(mine, counts, strict=True)]


class Metrics:
    """The counters and histograms of one process, in a registry of their own. Every
    label value exists from the start (0), so a rate() has a series before the first
    event."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.waits = WaitTally()
        self.job_transitions = self._counter(
            "arm_job_transitions",
            "Transitions of recognition jobs this process made or applied, by the status reached",
            ["to"],
            TRANSITIONS,
        )
        self.inbox_envelopes = self._counter(
            "arm_inbox_envelopes",
            "Messages the inbox took from the result subject, by what became of them",
            ["outcome"],
            ENVELOPE_OUTCOMES,
        )
        self.publish_batches = self._counter(
            "arm_publish_batches",
            "Publisher transactions that sent requests (publish and republish), by result",
            ["result"],
            ("ok", "failed"),
        )
        self.service_restarts = self._counter(
            "arm_service_restarts",
            "Restarts of this process's supervised loops (publisher, inbox-<n>, listen, "
            "schedule, stream, replay, nats-connect) after an exception they did not handle",
            ["service"],
        )
        self.redelivered = self._counter(
            "arm_inbox_redelivered",
            "Messages RESULTS_STREAM delivered again because no instance acknowledged them "
            "within its ack_wait (one that held them stopped or died, or the database was "
            "out)",
        )
        self.handed_back = self._counter(
            "arm_inbox_handed_back",
            "Messages of RESULTS_STREAM this process handed back unapplied (a NAK: "
            "delivered again 2 s later to whichever bridge fetches) because it could not "
            "reach its database, or was stopping",
        )
        self.replayed = self._counter(
            "arm_inbox_replayed",
            "Answers this process received by core NATS and handed to its inbox again when "
            "RESULTS_STREAM elected a leader (what the stream missed is applied, the rest "
            "are duplicates)",
        )
        self.republished = self._counter(
            "arm_republished_jobs",
            "Requests sent again because no ack came within ACK_TIMEOUT_SECONDS",
        )
        self.retries = self._counter(
            "arm_retries",
            "Files the API was asked to retry (one per file, batches included), by outcome",
            ["outcome"],
            RETRY_OUTCOMES,
        )
        self.job_wait = Histogram(
            "arm_job_wait_seconds",
            "How long jobs waited: queued (requested → published), ack (published → "
            "processing), processing (processing → final)",
            ["phase"],
            buckets=JOB_WAIT_BUCKETS,
            registry=self.registry,
        )
        for phase in PHASES:
            self.job_wait.labels(phase=phase)

    def _counter(
        self,
        name: str,
        documentation: str,
        labels: list[str] | None = None,
        values: tuple[str, ...] = (),
    ) -> Counter:
        counter = Counter(name, documentation, labels or [], registry=self.registry)
        for value in values:
            counter.labels(value)
        return counter

    def transition(self, to: str, n: int = 1) -> None:
        self.job_transitions.labels(to=to).inc(n)

    def envelope(self, outcome: str, n: int = 1) -> None:
        self.inbox_envelopes.labels(outcome=outcome).inc(n)

    def waited(self, phase: str, seconds: float | None) -> None:
        if seconds is not None:
            self.job_wait.labels(phase=phase).observe(max(0.0, seconds))
            self.waits.add(phase, seconds)


@dataclass(frozen=True, eq=False)
class Instruments:
    metrics: Metrics = field(default_factory=Metrics)
    outage: Outage = field(default_factory=Outage)
    pool_exhaustion: PoolExhaustion = field(default_factory=PoolExhaustion)
