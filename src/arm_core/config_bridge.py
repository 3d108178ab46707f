"""The bridge's settings in :class:`arm_core.config.Settings` and the checks that span
them: the database pool its loops share with the API and the sessions they hold open,
the inbox's bounds, the liveness stall and the JetStream results stream. (Each service's
own config is built from Settings in bridge/config.py.)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from arm_core.config_env import number
from arm_core.config_error import ConfigError

if TYPE_CHECKING:
    from arm_core.config import Settings

# Connections of the pool kept beside the bridge's loops for the API's requests,
# /healthcheck and /metrics (and `arm-core bridge`'s health port): each holds one for a
# statement of a few milliseconds, so four let a health check and a scrape run beside
# two requests before a request waits (DATABASE_POOL_TIMEOUT_SECONDS); a burst beyond
# that waits its turn rather than costing the server more sessions.
POOL_RESERVE = 4

# The longest the processes sit idle inside a transaction on purpose: the publisher
# claims jobs, publishes them and waits for NATS's confirmation (bridge/nats_client.py
# confirm: two flushes of up to CONFIRM_FLUSH_SECONDS each) before it commits.
CONFIRM_FLUSH_SECONDS = 5
PUBLISH_CONFIRM_SECONDS = 2 * CONFIRM_FLUSH_SECONDS
# idle_in_transaction_session_timeout of every session the processes open (the pool's,
# the LISTEN connection's, migrate's: arm_core.db.connection_options): twice the
# publisher's longest legitimate idle, so a slow NATS never gets a healthy publish's
# session ended, and well under a minute, so the session of a process whose network path
# went silent mid-transaction gives back its snapshot and row locks within seconds
# instead of hours.
IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = 20.0
# PostgreSQL takes the timeout in milliseconds, as a 32-bit integer (about 24.8 days).
_PG_MAX_MILLISECONDS = 2**31 - 1


def parse_idle_in_transaction(name: str, raw: str) -> float:
    """0 (leave the server's setting), or more than the publisher's wait for NATS inside
    its transaction and within what PostgreSQL takes."""
    value = number(float, 0)(name, raw)
    if 0 < value <= PUBLISH_CONFIRM_SECONDS:
        raise ConfigError(
            f"{name}: must be 0 (the server's setting) or more than "
            f"{PUBLISH_CONFIRM_SECONDS:g} s, the publisher's wait for NATS's confirmation "
            f"inside its transaction, got {raw!r}"
        )
    if value * 1000 > _PG_MAX_MILLISECONDS:
        raise ConfigError(f"{name}: at most {_PG_MAX_MILLISECONDS // 1000} s, got {raw!r}")
    return value


# A JetStream stream or consumer name: what every server version accepts (no `.`, `*`,
# `>`, path separators or spaces).
_JS_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_stream_name(name: str, raw: str) -> str:
    value = raw.strip()
    if not _JS_NAME.fullmatch(value):
        raise ConfigError(
            f"{name}: not a JetStream stream name (1 to 64 of A-Z a-z 0-9 _ -): {raw!r}"
        )
    return value


def parse_replicas(name: str, raw: str) -> int:
    value = number(int, 1)(name, raw)
    if value > 5:
        raise ConfigError(f"{name}: JetStream keeps 1 to 5 replicas, got {raw!r}")
    return value


def pool_max_size(settings: Settings) -> int:
    """The pool's max_size: DATABASE_POOL_MAX_SIZE, or by default the bridge's loops
    plus POOL_RESERVE. An explicit value that leaves the API no connection beside the
    bridge's loops raises ConfigError naming the variable."""
    loops = settings.bridge_connections()
    if settings.db_pool_max_size is None:
        return loops + POOL_RESERVE
    if settings.db_pool_max_size < loops + 1:
        raise ConfigError(
            f"DATABASE_POOL_MAX_SIZE: {settings.db_pool_max_size} is too small: at least "
            f"{loops + 1}, as the bridge's loops hold up to {loops} connections at once "
            f"(OUTBOX_PUBLISHERS={settings.outbox_publishers}, "
            f"INBOX_WORKERS={settings.inbox_workers}, the schedule runner 1) and the API, "
            "/healthcheck and /metrics need at least 1 more"
        )
    return settings.db_pool_max_size


def check_liveness(settings: Settings) -> None:
    """A loop waits up to DATABASE_POOL_TIMEOUT_SECONDS for a connection while the
    database is away, and that is no stall: LIVENESS_STALL_SECONDS must be longer
    (twice it), or /livez would ask for restarts an outage does not need."""
    if settings.liveness_stall_seconds <= 2 * settings.db_pool_timeout_seconds:
        raise ConfigError(
            "LIVENESS_STALL_SECONDS: must be more than twice DATABASE_POOL_TIMEOUT_SECONDS "
            f"({2 * settings.db_pool_timeout_seconds:g} s), "
            f"got {settings.liveness_stall_seconds:g}"
        )


def check_inbox(settings: Settings) -> None:
    """Each inbox worker's share of INBOX_BUFFER_BYTES holds a message of
    INBOX_MAX_PAYLOAD_BYTES (else such an answer could never be taken)."""
    need = settings.inbox_workers * settings.inbox_max_payload_bytes
    if settings.inbox_buffer_bytes < need:
        raise ConfigError(
            f"INBOX_BUFFER_BYTES: must be at least INBOX_WORKERS × "
            f"INBOX_MAX_PAYLOAD_BYTES ({need}), got {settings.inbox_buffer_bytes}"
        )
    if settings.inbox_workers > settings.inbox_buffer_size:
        raise ConfigError(
            f"INBOX_BUFFER_SIZE: must be at least INBOX_WORKERS ({settings.inbox_workers}), "
            f"got {settings.inbox_buffer_size}"
        )


def check_pacing(settings: Settings) -> None:
    """Each pipeline's in-flight floor is at most its ceiling."""
    for pipeline in ("tabular", "image"):
        low = getattr(settings, f"{pipeline}_min_in_flight")
        high = getattr(settings, f"{pipeline}_max_in_flight")
        if low > high:
            name = pipeline.upper()
            raise ConfigError(
                f"{name}_MIN_IN_FLIGHT: must be at most {name}_MAX_IN_FLIGHT ({high}), got {low}"
            )


def duplicate_window_seconds(settings: Settings) -> float:
    """The results stream's duplicate window: RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS,
    or when not given a third of ACK_TIMEOUT_SECONDS, at most 120 s and the maximum
    age, at least the server's 0.1 s. Shorter than ACK_TIMEOUT_SECONDS, so that a
    service's ack to a republished request (the same Nats-Msg-Id, ACK_TIMEOUT_SECONDS
    after the first) is stored, not dropped as a duplicate of the first ack."""
    if settings.results_stream_duplicate_window_seconds is not None:
        return settings.results_stream_duplicate_window_seconds
    derived = min(settings.ack_timeout_seconds / 3, 120.0, settings.results_stream_max_age_seconds)
    return max(derived, 0.1)


# The results stream consumer's ack_wait when RESULTS_STREAM_ACK_WAIT_SECONDS is not
# given: long enough for a full inbox buffer to be applied (an answer waiting on its
# job's publish is kept with in_progress), short enough that a crashed bridge's share
# comes back soon.
STREAM_ACK_WAIT_SECONDS = 30.0


def stream_ack_wait_seconds(settings: Settings) -> float:
    """How long the results stream waits for a bridge to settle a message it delivered
    before it delivers it again (to any bridge): RESULTS_STREAM_ACK_WAIT_SECONDS, or 30 s."""
    given = settings.results_stream_ack_wait_seconds
    return STREAM_ACK_WAIT_SECONDS if given is None else given


def check_results_stream(settings: Settings) -> None:
    """With RESULTS_STREAM set: the durable consumer is named after NATS_QUEUE_GROUP
    (so it must be a valid consumer name), a given ack_wait is at most
    ACK_TIMEOUT_SECONDS, JetStream wants the duplicate window within the maximum age, and
    the window must be shorter than ACK_TIMEOUT_SECONDS."""
    if not settings.results_stream:
        return
    if not _JS_NAME.fullmatch(settings.nats_queue_group):
        raise ConfigError(
            f"NATS_QUEUE_GROUP: names the durable consumer of RESULTS_STREAM, so only "
            f"A-Z a-z 0-9 _ - (1 to 64): {settings.nats_queue_group!r}"
        )
    ack_wait = settings.results_stream_ack_wait_seconds
    if ack_wait is not None and ack_wait > settings.ack_timeout_seconds:
        raise ConfigError(
            f"RESULTS_STREAM_ACK_WAIT_SECONDS: must not exceed ACK_TIMEOUT_SECONDS "
            f"({settings.ack_timeout_seconds:g}), got {ack_wait:g}: a service's ack held by "
            "a bridge that died would come back only after its request was sent again"
        )
    window = duplicate_window_seconds(settings)
    max_age = settings.results_stream_max_age_seconds
    if window > max_age:
        raise ConfigError(
            "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS: must not exceed "
            f"RESULTS_STREAM_MAX_AGE_SECONDS ({max_age:g})"
        )
    if window >= settings.ack_timeout_seconds:
        given = settings.results_stream_duplicate_window_seconds is not None
        raise ConfigError(
            f"RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS: must be shorter than "
            f"ACK_TIMEOUT_SECONDS ({settings.ack_timeout_seconds:g}), got {window:g}"
            f"{'' if given else ' (not given: the server minimum of 0.1 s)'}: a service's ack "
            "to a republished request carries the first ack's Nats-Msg-Id, and the "
            "stream would drop it as a duplicate"
        )
