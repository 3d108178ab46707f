"""Each service of the bridge has a small config of its own: the tunables it uses, with
their defaults, checked when it is made. :func:`bridge_config` builds them all from the
process's Settings (the environment) in this one place; a test builds the one it needs
with the values it wants.

A tunable that is an environment variable takes its default from Settings (the one
place it is written, which docs/configuration.md is generated from); the numbers that
are not (backoffs, re-check periods) are defaults here, not constants in the services'
code."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from arm_core.config import Settings


def _env(name: str) -> Any:
    """The default of Settings' field `name` (an environment variable's)."""
    return Settings.model_fields[name].default


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
    """The outbox publisher (bridge/publisher.py)."""

    tabular_request_subject: str = _env("tabular_request_subject")
    image_request_subject: str = _env("image_request_subject")
    tabular_reply_timeout_seconds: float = _env("tabular_reply_timeout_seconds")
    image_reply_timeout_seconds: float = _env("image_reply_timeout_seconds")
    ack_timeout_seconds: float = _env("ack_timeout_seconds")
    # Jobs claimed per transaction, and how many such transactions run at once behind
    # a full one.
    batch_size: int = _env("outbox_batch_size")
    publishers: int = _env("outbox_publishers")
    # The backstop of the NOTIFY wake-up.
    poll_seconds: float = _env("outbox_poll_seconds")
    # For active_seconds after a cycle that claimed jobs, the next cycle comes after
    # active_poll_seconds: a job that joined the non-empty queue meanwhile sent no NOTIFY.
    active_poll_seconds: float = 0.01
    active_seconds: float = 1.0
    max_republish: int = _env("outbox_max_republish")
    # Pacing (db/functions/22_pacing.sql): the mode and each pipeline's in-flight bounds.
    pacing: str = _env("pacing")
    tabular_min_in_flight: int = _env("tabular_min_in_flight")
    tabular_max_in_flight: int = _env("tabular_max_in_flight")
    image_min_in_flight: int = _env("image_min_in_flight")
    image_max_in_flight: int = _env("image_max_in_flight")
    # The ack-timeout steps run at most this often (and at most every ACK_TIMEOUT / 4).
    ack_check_seconds: float = 1.0
    # NATS unreachable for longer than this is logged as an error (the first connect at
    # start-up takes a moment and is not an error).
    nats_grace_seconds: float = 5.0

    def __post_init__(self) -> None:
        # A deadline of 0 is due at once; 0 republishes dead-letters at the first timeout.
        _check_positive(
            self,
            "max_republish",
            "ack_timeout_seconds",
            "tabular_reply_timeout_seconds",
            "image_reply_timeout_seconds",
        )


@dataclass(frozen=True, slots=True)
class InboxConfig:
    """The inbox (bridge/inbox.py)."""

    # One buffer and one worker per worker; a job's envelopes always share one.
    workers: int = _env("inbox_workers")
    # Envelopes held across the buffers while the database is unreachable, and the bytes
    # they came as (each worker has its share of both).
    buffer_size: int = _env("inbox_buffer_size")
    buffer_bytes: int = _env("inbox_buffer_bytes")
    # Envelopes per apply_envelopes_v2 call (per transaction).
    batch_size: int = _env("inbox_batch_size")
    # A message larger than this is rejected unread.
    max_payload_bytes: int = _env("inbox_max_payload_bytes")
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
        if self.workers > self.buffer_size:
            raise ValueError(f"InboxConfig: {self.workers} workers need a buffer_size as large")
        if self.buffer_bytes // self.workers < self.max_payload_bytes:
            raise ValueError(
                "InboxConfig: each worker's share of buffer_bytes must hold a message of "
                "max_payload_bytes"
            )


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The schedule runner (bridge/scheduler.py)."""

    tick_seconds: float = _env("schedule_tick_seconds")
    # The per-status counts' deltas are folded at most this often (arm.compact_counts).
    compact_every_seconds: float = 5.0
    # The waits observed (the process's Metrics.waits) go to arm.record_waits at most this
    # often: the console's wait chart (db/functions/82_samples.sql).
    wait_sample_seconds: float = 15.0
    # The bridge's row of arm.bridge_instance (it is alive, and its state) is written at
    # most this often: what a console without a bridge of its own shows.
    heartbeat_seconds: float = 5.0
    # TIMEOUT_SWEEP_SECONDS when it was given: the sweep's period, written to
    # arm.periodic_task by the first tick that reaches the database. None: the period a
    # DBA set there stands.
    sweep_interval_seconds: float | None = None

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How the supervisor (bridge/service.py) restarts a loop, and when it gives up."""

    # More crashes than `limit` within `window_seconds` make the process fatal.
    limit: int = _env("service_restart_limit")
    window_seconds: float = _env("service_restart_window_seconds")
    # The first restart comes after backoff_seconds, each next one after twice the last,
    # up to backoff_max_seconds.
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 10.0
    # A loop that has not come round for this long is stalled (GET /livez fails).
    stall_seconds: float = _env("liveness_stall_seconds")

    def __post_init__(self) -> None:
        _check_positive(self, "limit")


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """The bridge (bridge/runner.py): where answers come from, and its services'."""

    result_subject: str = _env("result_subject")
    queue_group: str = _env("nats_queue_group")
    # The JetStream stream the answers are consumed from; None: core NATS, queue group.
    results_stream: str | None = None
    # How long stop() may take in all before what is still held is dropped (counted).
    stop_grace_seconds: float = 10.0
    # JetStream: how long to wait before asking again when the stream does not answer,
    # and the longest pause between failed fetches.
    stream_retry_seconds: float = 2.0
    fetch_pause_max_seconds: float = 2.0
    # RESULTS_STREAM_REPLAY_SECONDS (bridge/replay.py); 0: off.
    replay_seconds: float = _env("results_stream_replay_seconds")
    # After the stream's leader-elected advisory, how long to let the answers published
    # before the election reach this bridge by core NATS before they are applied again.
    replay_delay_seconds: float = 1.0
    publisher: PublisherConfig = PublisherConfig()
    inbox: InboxConfig = InboxConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    restarts: RestartPolicy = RestartPolicy()

    def __post_init__(self) -> None:
        _check_positive(self, "replay_seconds")


def bridge_config(settings: Settings) -> BridgeConfig:
    """The bridge's config from the environment's Settings (already validated there)."""
    s = settings
    return BridgeConfig(
        result_subject=s.result_subject,
        queue_group=s.nats_queue_group,
        results_stream=s.results_stream or None,
        replay_seconds=s.results_stream_replay_seconds,
        publisher=PublisherConfig(
            tabular_request_subject=s.tabular_request_subject,
            image_request_subject=s.image_request_subject,
            tabular_reply_timeout_seconds=s.tabular_reply_timeout_seconds,
            image_reply_timeout_seconds=s.image_reply_timeout_seconds,
            ack_timeout_seconds=s.ack_timeout_seconds,
            batch_size=s.outbox_batch_size,
            publishers=s.outbox_publishers,
            poll_seconds=s.outbox_poll_seconds,
            max_republish=s.outbox_max_republish,
            pacing=s.pacing,
            tabular_min_in_flight=s.tabular_min_in_flight,
            tabular_max_in_flight=s.tabular_max_in_flight,
            image_min_in_flight=s.image_min_in_flight,
            image_max_in_flight=s.image_max_in_flight,
        ),
        inbox=InboxConfig(
            workers=s.inbox_workers,
            buffer_size=s.inbox_buffer_size,
            buffer_bytes=s.inbox_buffer_bytes,
            batch_size=s.inbox_batch_size,
            max_payload_bytes=s.inbox_max_payload_bytes,
        ),
        restarts=RestartPolicy(
            limit=s.service_restart_limit,
            window_seconds=s.service_restart_window_seconds,
            stall_seconds=s.liveness_stall_seconds,
        ),
        scheduler=SchedulerConfig(
            tick_seconds=s.schedule_tick_seconds,
            sweep_interval_seconds=(
                s.timeout_sweep_seconds if "TIMEOUT_SWEEP_SECONDS" in s.explicit else None
            ),
        ),
    )
