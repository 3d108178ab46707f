"""What the bridge and each of its services are configured with: the process's Settings
(each variable read where it is used, written once in arm_core.config) and the numbers
that are no variable (backoffs, re-check periods). A test replaces the ones it needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from arm_core.config import Settings


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    settings: Settings = field(default_factory=Settings)

    # The publisher (bridge/publisher.py). For active_seconds after a cycle that claimed
    # jobs, the next cycle comes after active_poll_seconds: a job that joined the
    # non-empty queue meanwhile sent no NOTIFY.
    active_poll_seconds: float = 0.01
    active_seconds: float = 1.0
    # The ack-timeout steps run at most this often (and at most every ACK_TIMEOUT / 4).
    ack_check_seconds: float = 1.0
    # NATS unreachable for longer than this is logged as an error (the first connect at
    # start-up takes a moment and is not an error).
    nats_grace_seconds: float = 5.0

    # The inbox (bridge/inbox.py). How long a full buffer makes the callback wait before
    # it looks again whether the database has meanwhile become unreachable (then it drops
    # instead of waiting).
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

    # The schedule runner (bridge/scheduler.py): the per-status counts' deltas are folded
    # (arm.compact_counts), the waits observed go to arm.record_waits (the console's wait
    # chart) and the bridge's row of arm.bridge_instance is written at most this often.
    compact_every_seconds: float = 5.0
    wait_sample_seconds: float = 15.0
    heartbeat_seconds: float = 5.0

    # The supervisor (bridge/service.py): a crashed loop's first restart comes after
    # restart_backoff_seconds, each next one after twice the last, up to the maximum.
    restart_backoff_seconds: float = 0.5
    restart_backoff_max_seconds: float = 10.0

    # The bridge (bridge/runner.py): how long stop() may take in all before what is still
    # held is dropped (counted).
    stop_grace_seconds: float = 10.0
    # JetStream: how long to wait before asking again when the stream does not answer,
    # and the longest pause between failed fetches.
    stream_retry_seconds: float = 2.0
    fetch_pause_max_seconds: float = 2.0
    # After the stream's leader-elected advisory, how long to let the answers published
    # before the election reach this bridge by core NATS before they are applied again.
    replay_delay_seconds: float = 1.0
