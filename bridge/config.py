"""What each service of the bridge is configured with: the process's Settings, whose
fields it reads where it uses them (the environment's variables, written once in
arm_core.config), and the numbers of its own that are no variable (backoffs, re-check
periods), with their defaults, checked when made. The bridge receives one
:class:`BridgeConfig`; each service's config is made from it. A test builds the one it
needs with the settings and numbers it wants."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from arm_core.config import Settings


def _check_positive(config: object, *zero_allowed: str) -> None:
    """Every number of a config is above zero (a zero period would spin, a zero size
    would hold nothing), but those named, which may be zero."""
    for f in fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if value < 0 or (value == 0 and f.name not in zero_allowed):
            raise ValueError(f"{type(config).__name__}.{f.name} must be above 0, not {value}")


@dataclass(frozen=True, slots=True)
class PublisherConfig:
    """The outbox publisher (bridge/publisher.py): OUTBOX_*, ACK_TIMEOUT_SECONDS, the
    pacing, the request subjects and reply timeouts of `settings`."""

    settings: Settings = field(default_factory=Settings)
    # For active_seconds after a cycle that claimed jobs, the next cycle comes after
    # active_poll_seconds: a job that joined the non-empty queue meanwhile sent no NOTIFY.
    active_poll_seconds: float = 0.01
    active_seconds: float = 1.0
    # The ack-timeout steps run at most this often (and at most every ACK_TIMEOUT / 4).
    ack_check_seconds: float = 1.0
    # NATS unreachable for longer than this is logged as an error (the first connect at
    # start-up takes a moment and is not an error).
    nats_grace_seconds: float = 5.0

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True, slots=True)
class InboxConfig:
    """The inbox (bridge/inbox.py): INBOX_* of `settings`."""

    settings: Settings = field(default_factory=Settings)
    # How long a full buffer makes the callback wait before it looks again whether the
    # database has meanwhile become unreachable (then it drops instead of waiting).
    full_recheck_seconds: float = 0.5
    # A batch that was all `busy` waits this long before it is tried again, doubling
    # while it stays so, up to busy_pause_max_seconds.
    busy_pause_seconds: float = 0.005
    busy_pause_max_seconds: float = 0.5
    # While the database is unreachable a batch is tried again after this backoff,
    # doubling up to the maximum; at shutdown it is dropped once past the maximum.
    backoff_seconds: float = 0.2
    backoff_max_seconds: float = 5.0
    # An answer for a job that is still queued (`not_published`: the transaction that sent
    # its request had not committed, and rolled back) is applied again every
    # not_published_retry_seconds for up to not_published_patience_seconds after it came:
    # the job is published again, with the same Nats-Msg-Id and attempt, within seconds
    # (once the server ends a lost publisher's session: idle_in_transaction_session_timeout).
    not_published_retry_seconds: float = 2.0
    not_published_patience_seconds: float = 90.0

    def __post_init__(self) -> None:
        _check_positive(self, "not_published_retry_seconds", "not_published_patience_seconds")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The schedule runner (bridge/scheduler.py): SCHEDULE_TICK_SECONDS and
    TIMEOUT_SWEEP_SECONDS of `settings`."""

    settings: Settings = field(default_factory=Settings)
    # The per-status counts' deltas are folded at most this often (arm.compact_counts).
    compact_every_seconds: float = 5.0
    # The waits observed (the process's Metrics.waits) go to arm.record_waits at most this
    # often: the console's wait chart (db/functions/82_samples.sql).
    wait_sample_seconds: float = 15.0
    # The bridge's row of arm.bridge_instance (it is alive, and its state) is written at
    # most this often: what a console without a bridge of its own shows.
    heartbeat_seconds: float = 5.0

    def __post_init__(self) -> None:
        _check_positive(self)

    @property
    def sweep_interval_seconds(self) -> float | None:
        """TIMEOUT_SWEEP_SECONDS when it was given: the sweep's period, written to
        arm.periodic_task by the first tick that reaches the database. None: the period a
        DBA set there stands."""
        given = "TIMEOUT_SWEEP_SECONDS" in self.settings.explicit
        return self.settings.timeout_sweep_seconds if given else None


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How the supervisor (bridge/service.py) restarts a loop, and when it gives up:
    SERVICE_RESTART_LIMIT, SERVICE_RESTART_WINDOW_SECONDS and LIVENESS_STALL_SECONDS of
    `settings`."""

    settings: Settings = field(default_factory=Settings)
    # The first restart comes after backoff_seconds, each next one after twice the last,
    # up to backoff_max_seconds.
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 10.0

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """The bridge (bridge/runner.py): its settings (the NATS connection, the results
    stream, the result subject and queue group, the LISTEN session), its
    own numbers, and its services' configs, made from the same settings."""

    settings: Settings = field(default_factory=Settings)
    # How long stop() may take in all before what is still held is dropped (counted).
    stop_grace_seconds: float = 10.0
    # JetStream: how long to wait before asking again when the stream does not answer,
    # and the longest pause between failed fetches.
    stream_retry_seconds: float = 2.0
    fetch_pause_max_seconds: float = 2.0
    # After the stream's leader-elected advisory, how long to let the answers published
    # before the election reach this bridge by core NATS before they are applied again.
    replay_delay_seconds: float = 1.0

    def __post_init__(self) -> None:
        _check_positive(self)

    @property
    def publisher(self) -> PublisherConfig:
        return PublisherConfig(self.settings)

    @property
    def inbox(self) -> InboxConfig:
        return InboxConfig(self.settings)

    @property
    def scheduler(self) -> SchedulerConfig:
        return SchedulerConfig(self.settings)

    @property
    def restarts(self) -> RestartPolicy:
        return RestartPolicy(self.settings)
