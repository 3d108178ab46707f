"""Configuration from the environment (docs/behaviour.md#configuration).

Every variable is parsed once at start. A bad value raises :class:`ConfigError` whose
message names the variable, so a misconfigured container fails at once and says why.

:class:`Settings` declares each variable with :func:`env_var` and reads them all with
:func:`read_env` (arm_core.config_env, the one environment parser, which the dev tools'
``REFERENCE_*`` configuration uses too). The parsers of its variables and the checks
that span several live beside it, by topic: arm_core.config_access (AUTH_MODE, tokens,
groups) and arm_core.config_connections (DATABASE_URL, NATS_URL, subjects, ports, TLS
files); those of the bridge are here. Secrets are masked in its messages by
arm_core.redaction; the NATS seed and JWT are checked by arm_core.nats_credentials.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from arm_core import config_access, config_connections
from arm_core.access import METRICS_AUTH_MODES, ApiToken
from arm_core.config_access import AUTH_MODES, is_loopback, parse_groups, parse_header, parse_tokens
from arm_core.config_connections import (
    parse_database_url,
    parse_nats_urls,
    parse_path,
    parse_port,
    parse_subject,
)
from arm_core.config_env import env_var, number, one_of, parse_bool, read_env, text
from arm_core.config_error import ConfigError
from arm_core.nats_credentials import JWT_VAR, SEED_VAR, nats_keypair, parse_jwt, parse_seed
from arm_core.redaction import mask_url, url_secrets
from arm_core.tls import https_server_context

# The names other modules import from here (some of them defined in arm_core.config_*).
__all__ = [
    "AUTH_MODES",
    "CONFIRM_FLUSH_SECONDS",
    "FAULT_POINTS",
    "IDLE_IN_TRANSACTION_TIMEOUT_SECONDS",
    "LOG_FORMATS",
    "POOL_RESERVE",
    "PUBLISH_CONFIRM_SECONDS",
    "ConfigError",
    "Settings",
    "env_var",
    "is_loopback",
    "mask_url",
    "number",
    "one_of",
    "parse_bool",
    "read_env",
    "text",
]

# A JetStream stream or consumer name: what every server version accepts (no `.`, `*`,
# `>`, path separators or spaces).
_JS_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _stream_name(name: str, raw: str) -> str:
    value = raw.strip()
    if not _JS_NAME.fullmatch(value):
        raise ConfigError(
            f"{name}: not a JetStream stream name (1 to 64 of A-Z a-z 0-9 _ -): {raw!r}"
        )
    return value


def _replicas(name: str, raw: str) -> int:
    value = number(int, 1)(name, raw)
    if value > 5:
        raise ConfigError(f"{name}: JetStream keeps 1 to 5 replicas, got {raw!r}")
    return value


FAULT_POINTS = (
    "publisher", "inbox", "listen", "schedule", "waits", "stream", "replay", "connect",
)  # fmt: skip


def _faults(name: str, raw: str) -> tuple[tuple[str, int], ...]:
    """`point=count,…` with each point one of FAULT_POINTS and count a whole number
    (-1: every time)."""
    pairs: list[tuple[str, int]] = []
    for entry in (part.strip() for part in raw.split(",") if part.strip()):
        point, sep, count = entry.partition("=")
        point = point.strip()
        if point not in FAULT_POINTS:
            raise ConfigError(f"{name}: unknown fault point {point!r} ({', '.join(FAULT_POINTS)})")
        times = number(int, -1)(name, count) if sep else 1
        pairs.append((point, times))
    return tuple(pairs)


_POSITIVE = number(float, 0.001)
LOG_FORMATS = ("text", "json")

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


def _idle_in_transaction(name: str, raw: str) -> float:
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


@dataclass(frozen=True, repr=False)
class Settings:
    """Everything the processes read from the environment, with its defaults
    (docs/behaviour.md#configuration)."""

    database_url: str | None = env_var("DATABASE_URL", parse_database_url, None)
    db_pool_timeout_seconds: float = env_var("DATABASE_POOL_TIMEOUT_SECONDS", _POSITIVE, 5.0)
    # The most connections the process's pool opens; None: enough for the bridge's loops
    # and POOL_RESERVE (pool_max_size()).
    db_pool_max_size: int | None = env_var("DATABASE_POOL_MAX_SIZE", number(int, 1), None)
    # The server ends a session left idle inside a transaction this long (every session:
    # arm_core.db.connection_options); 0 leaves the server's setting, and an
    # idle_in_transaction_session_timeout in DATABASE_URL's options wins.
    db_idle_in_transaction_timeout_seconds: float = env_var(
        "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS",
        _idle_in_transaction,
        IDLE_IN_TRANSACTION_TIMEOUT_SECONDS,
    )
    nats_urls: tuple[str, ...] = env_var("NATS_URL", parse_nats_urls, ("nats://127.0.0.1:4222",))
    nats_enabled: bool = env_var("NATS_ENABLED", parse_bool, True)
    debug: bool = env_var("DEBUG", parse_bool, False)
    # Log lines on stderr: "text" (key=value, for people) or "json" (one object a line).
    log_format: str = env_var("LOG_FORMAT", one_of(LOG_FORMATS), "text")
    # A user nkey seed (SU…) and its JWT: checked at start, never shown (see secrets()).
    nats_seed: str = env_var(SEED_VAR, parse_seed, "")
    nats_jwt: str = env_var(JWT_VAR, parse_jwt, "")
    outbox_poll_seconds: float = env_var("OUTBOX_POLL_SECONDS", _POSITIVE, 5.0)
    outbox_batch_size: int = env_var("OUTBOX_BATCH_SIZE", number(int, 1), 500)
    # Publish batches in flight at once per process (each on its own connection).
    outbox_publishers: int = env_var("OUTBOX_PUBLISHERS", number(int, 1), 2)
    ack_timeout_seconds: float = env_var("ACK_TIMEOUT_SECONDS", _POSITIVE, 30.0)
    outbox_max_republish: int = env_var("OUTBOX_MAX_REPUBLISH", number(int, 0), 3)
    timeout_sweep_seconds: float = env_var("TIMEOUT_SWEEP_SECONDS", number(float, 1), 30.0)
    schedule_tick_seconds: float = env_var("SCHEDULE_TICK_SECONDS", _POSITIVE, 1.0)
    tabular_reply_timeout_seconds: float = env_var(
        "TABULAR_REPLY_TIMEOUT_SECONDS", _POSITIVE, 600.0
    )
    image_reply_timeout_seconds: float = env_var("IMAGE_REPLY_TIMEOUT_SECONDS", _POSITIVE, 1800.0)
    default_max_attempts: int = env_var("DEFAULT_MAX_ATTEMPTS", number(int, 1), 3)
    http_host: str = env_var("HTTP_HOST", text, "127.0.0.1")
    http_port: int = env_var("HTTP_PORT", parse_port, 8080)
    bridge_health_port: int = env_var("BRIDGE_HEALTH_PORT", parse_port, 8081)
    tabular_request_subject: str = env_var(
        "TABULAR_REQUEST_SUBJECT", parse_subject, "files.tabular_uploaded"
    )
    image_request_subject: str = env_var(
        "IMAGE_REQUEST_SUBJECT", parse_subject, "files.img_uploaded"
    )
    result_subject: str = env_var("RESULT_SUBJECT", parse_subject, "files.tabular_parsed")
    nats_queue_group: str = env_var("NATS_QUEUE_GROUP", parse_subject, "arm-core")
    inbox_max_payload_bytes: int = env_var("INBOX_MAX_PAYLOAD_BYTES", number(int, 1024), 1 << 20)
    inbox_buffer_size: int = env_var("INBOX_BUFFER_SIZE", number(int, 1), 10_000)
    # What the envelopes held in the inbox came as, in bytes, at most: the bound on the
    # memory answers take while the database is away (with RESULTS_STREAM about twice
    # this: each message is kept until acked). The default fits a 256 MiB container.
    inbox_buffer_bytes: int = env_var("INBOX_BUFFER_BYTES", number(int, 1 << 16), 32 << 20)
    # Inbox workers, each with its own connection and share of INBOX_BUFFER_SIZE; a job's
    # envelopes always go to the same one.
    inbox_workers: int = env_var("INBOX_WORKERS", number(int, 1), 2)
    # Envelopes applied in one transaction (one SQL call) at most.
    inbox_batch_size: int = env_var("INBOX_BATCH_SIZE", number(int, 1), 500)
    # The oldest queued job waiting longer than this while NATS is up makes the health
    # check say "degraded" (outbox stuck).
    outbox_stuck_seconds: float = env_var("OUTBOX_STUCK_SECONDS", _POSITIVE, 60.0)
    retry_batch_max: int = env_var("RETRY_BATCH_MAX", number(int, 1), 1000)
    http_max_body_bytes: int = env_var("HTTP_MAX_BODY_BYTES", number(int, 1024), 256 * 1024)
    # A client gets this long to send a request's line and headers, and then this long for
    # its body; a slower one is answered 408 and disconnected, never held forever.
    http_header_timeout_seconds: float = env_var("HTTP_HEADER_TIMEOUT_SECONDS", _POSITIVE, 10.0)
    http_body_timeout_seconds: float = env_var("HTTP_BODY_TIMEOUT_SECONDS", _POSITIVE, 30.0)
    # AUTH_MODE=none on a non-loopback HTTP_HOST refuses to start unless this says that
    # anonymous access from the network is intended.
    auth_allow_anonymous: bool = env_var("AUTH_ALLOW_ANONYMOUS", parse_bool, False)
    # Who retried (the audit's actor): none → "anonymous"; token → the actor whose
    # API_TOKENS entry matches `Authorization: Bearer …`; header → the identity an
    # authenticating proxy puts in AUTH_HEADER (e.g. oauth2-proxy's X-Forwarded-User).
    auth_mode: str = env_var("AUTH_MODE", one_of(AUTH_MODES), "none")
    api_tokens: tuple[ApiToken, ...] = env_var("API_TOKENS", parse_tokens, ())
    auth_header: str = env_var("AUTH_HEADER", parse_header, "X-Forwarded-User")
    # AUTH_MODE=header: the header in which the proxy lists the caller's groups (e.g.
    # oauth2-proxy's X-Forwarded-Groups, comma-separated). Unset, every identified caller
    # holds every level; set, a caller's groups decide: one of AUTH_OPERATOR_GROUPS makes
    # an operator, one of AUTH_VIEWER_GROUPS a viewer, one of AUTH_METRICS_GROUPS may read
    # /metrics; a caller in none of them is refused (403).
    auth_groups_header: str = env_var("AUTH_GROUPS_HEADER", parse_header, "")
    auth_operator_groups: frozenset[str] = env_var(
        "AUTH_OPERATOR_GROUPS", parse_groups, frozenset()
    )
    auth_viewer_groups: frozenset[str] = env_var("AUTH_VIEWER_GROUPS", parse_groups, frozenset())
    auth_metrics_groups: frozenset[str] = env_var("AUTH_METRICS_GROUPS", parse_groups, frozenset())
    # GET /metrics: level → a caller of level metrics (a token `actor:metrics=…`, a
    # token without a level, a caller in AUTH_METRICS_GROUPS; anyone with AUTH_MODE=none);
    # any → any caller the API accepts; none → no credentials (a scrape on a private
    # network). /healthcheck, /livez and /readyz never ask for any.
    metrics_auth: str = env_var("METRICS_AUTH", one_of(METRICS_AUTH_MODES), "level")
    # JetStream capture of answers (docs/not-losing-answers.md): off when empty.
    results_stream: str = env_var("RESULTS_STREAM", _stream_name, "")
    results_stream_replicas: int = env_var("RESULTS_STREAM_REPLICAS", _replicas, 1)
    results_stream_max_age_seconds: float = env_var(
        "RESULTS_STREAM_MAX_AGE_SECONDS", number(float, 1), 7 * 24 * 3600.0
    )
    # The stream's byte limit. It holds only what no bridge has applied yet (interest
    # retention) and refuses new messages when full (discard new): at least 1 MiB, the
    # largest message a default nats-server takes.
    results_stream_max_bytes: int = env_var(
        "RESULTS_STREAM_MAX_BYTES", number(int, 1 << 20), 1 << 30
    )
    # None: derived from ACK_TIMEOUT_SECONDS (duplicate_window_seconds). 0.1 s is the
    # server's minimum.
    results_stream_duplicate_window_seconds: float | None = env_var(
        "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS", number(float, 0.1), None
    )
    # How long each bridge keeps the answers core NATS delivered, to apply them again when
    # the stream elects a leader (bridge/replay.py); 0: not kept.
    results_stream_replay_seconds: float = env_var(
        "RESULTS_STREAM_REPLAY_SECONDS", number(float, 0), 15.0
    )
    # TLS (src/arm_core/tls.py): file paths, read and checked at start. NATS: the CA that
    # signed the servers' certificates (the system's CAs when empty) and, for mutual TLS,
    # this client's certificate and key. HTTPS of serve and the bridge's health port.
    nats_tls_ca_file: str = env_var("NATS_TLS_CA_FILE", parse_path, "")
    nats_tls_cert_file: str = env_var("NATS_TLS_CERT_FILE", parse_path, "")
    nats_tls_key_file: str = env_var("NATS_TLS_KEY_FILE", parse_path, "")
    # TLS before the server's first word (nats-server's tls { handshake_first: true }):
    # not a byte in clear, whatever answers at the address.
    nats_tls_handshake_first: bool = env_var("NATS_TLS_HANDSHAKE_FIRST", parse_bool, False)
    http_tls_cert_file: str = env_var("HTTP_TLS_CERT_FILE", parse_path, "")
    http_tls_key_file: str = env_var("HTTP_TLS_KEY_FILE", parse_path, "")
    # A loop of the bridge that crashes is restarted (bridge/service.py); more than
    # SERVICE_RESTART_LIMIT crashes of one loop within SERVICE_RESTART_WINDOW_SECONDS stop
    # the process (exit 1), for its supervisor to start a fresh one.
    service_restart_limit: int = env_var("SERVICE_RESTART_LIMIT", number(int, 0), 5)
    service_restart_window_seconds: float = env_var(
        "SERVICE_RESTART_WINDOW_SECONDS", _POSITIVE, 300.0
    )
    # GET /livez fails when a loop has not come round for this long (it is stuck).
    liveness_stall_seconds: float = env_var("LIVENESS_STALL_SECONDS", number(float, 1), 180.0)
    # Tests only: loops' fault points that raise, e.g. "inbox=1,publisher=-1" (bridge/
    # service.py FaultPoints: the next N turns, -1 every turn). Never set in production.
    test_faults: tuple[tuple[str, int], ...] = env_var("TEST_FAULTS", _faults, ())
    # Names of the variables that were given explicitly (not defaulted).
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        # An (actor, token) pair given in code (tests, tools) is an entry without a level.
        tokens = tuple(t if isinstance(t, ApiToken) else ApiToken(*t) for t in self.api_tokens)
        object.__setattr__(self, "api_tokens", tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Reads every variable; raises ConfigError naming the first bad one."""
        values, given = read_env(cls, os.environ if environ is None else environ)
        settings = cls(**values, explicit=given)
        config_access.check_access(settings)
        nats_keypair(settings.nats_seed, settings.nats_jwt)
        settings.check_inbox()
        settings.check_liveness()
        settings.check_results_stream()
        settings.pool_max_size()  # too small for the bridge's loops: exit 2 at start
        settings.nats_tls_context()  # every TLS file read and checked now: exit 2 if bad
        settings.https_context()
        return settings

    def bridge_connections(self) -> int:
        """Connections the bridge's loops hold at once at most when this process runs the
        bridge (NATS_ENABLED): one per publisher and per inbox worker, one for the
        schedule runner; 0 otherwise."""
        if not self.nats_enabled:
            return 0
        return self.outbox_publishers + self.inbox_workers + 1

    def pool_max_size(self) -> int:
        """The pool's max_size: DATABASE_POOL_MAX_SIZE, or by default the bridge's loops
        plus POOL_RESERVE. An explicit value that leaves the API no connection beside the
        bridge's loops raises ConfigError naming the variable."""
        loops = self.bridge_connections()
        if self.db_pool_max_size is None:
            return loops + POOL_RESERVE
        if self.db_pool_max_size < loops + 1:
            raise ConfigError(
                f"DATABASE_POOL_MAX_SIZE: {self.db_pool_max_size} is too small: at least "
                f"{loops + 1}, as the bridge's loops hold up to {loops} connections at once "
                f"(OUTBOX_PUBLISHERS={self.outbox_publishers}, "
                f"INBOX_WORKERS={self.inbox_workers}, the schedule runner 1) and the API, "
                "/healthcheck and /metrics need at least 1 more"
            )
        return self.db_pool_max_size

    def nats_tls_context(self) -> ssl.SSLContext | None:
        """The SSL context of every NATS connection, or None
        (arm_core.config_connections.nats_tls_context)."""
        return config_connections.nats_tls_context(self)

    def certificate_files(self) -> dict[str, str]:
        """Every certificate file this process reads, by the variable that names it
        (arm_core.config_connections.certificate_files)."""
        return config_connections.certificate_files(self)

    def https_context(self) -> ssl.SSLContext | None:
        """The server context of `serve` and the bridge's health port (HTTP_TLS_CERT_FILE,
        HTTP_TLS_KEY_FILE); None: plain HTTP."""
        return https_server_context(self.http_tls_cert_file, self.http_tls_key_file)

    def check_liveness(self) -> None:
        """A loop waits up to DATABASE_POOL_TIMEOUT_SECONDS for a connection while the
        database is away, and that is no stall: LIVENESS_STALL_SECONDS must be longer
        (twice it), or /livez would ask for restarts an outage does not need."""
        if self.liveness_stall_seconds <= 2 * self.db_pool_timeout_seconds:
            raise ConfigError(
                "LIVENESS_STALL_SECONDS: must be more than twice DATABASE_POOL_TIMEOUT_SECONDS "
                f"({2 * self.db_pool_timeout_seconds:g} s), got {self.liveness_stall_seconds:g}"
            )

    def check_inbox(self) -> None:
        """Each inbox worker's share of INBOX_BUFFER_BYTES holds a message of
        INBOX_MAX_PAYLOAD_BYTES (else such an answer could never be taken)."""
        need = self.inbox_workers * self.inbox_max_payload_bytes
        if self.inbox_buffer_bytes < need:
            raise ConfigError(
                f"INBOX_BUFFER_BYTES: must be at least INBOX_WORKERS × "
                f"INBOX_MAX_PAYLOAD_BYTES ({need}), got {self.inbox_buffer_bytes}"
            )
        if self.inbox_workers > self.inbox_buffer_size:
            raise ConfigError(
                f"INBOX_BUFFER_SIZE: must be at least INBOX_WORKERS ({self.inbox_workers}), "
                f"got {self.inbox_buffer_size}"
            )

    @property
    def duplicate_window_seconds(self) -> float:
        """The results stream's duplicate window: RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS,
        or when not given a third of ACK_TIMEOUT_SECONDS, at most 120 s and the maximum
        age, at least the server's 0.1 s. Shorter than ACK_TIMEOUT_SECONDS, so that a
        service's ack to a republished request (the same Nats-Msg-Id, ACK_TIMEOUT_SECONDS
        after the first) is stored, not dropped as a duplicate of the first ack."""
        if self.results_stream_duplicate_window_seconds is not None:
            return self.results_stream_duplicate_window_seconds
        derived = min(self.ack_timeout_seconds / 3, 120.0, self.results_stream_max_age_seconds)
        return max(derived, 0.1)

    def check_results_stream(self) -> None:
        """With RESULTS_STREAM set: the durable consumer is named after NATS_QUEUE_GROUP
        (so it must be a valid consumer name), JetStream wants the duplicate window within
        the maximum age, and the window must be shorter than ACK_TIMEOUT_SECONDS."""
        if not self.results_stream:
            return
        if not _JS_NAME.fullmatch(self.nats_queue_group):
            raise ConfigError(
                f"NATS_QUEUE_GROUP: names the durable consumer of RESULTS_STREAM, so only "
                f"A-Z a-z 0-9 _ - (1 to 64): {self.nats_queue_group!r}"
            )
        window = self.duplicate_window_seconds
        if window > self.results_stream_max_age_seconds:
            raise ConfigError(
                "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS: must not exceed "
                f"RESULTS_STREAM_MAX_AGE_SECONDS ({self.results_stream_max_age_seconds:g})"
            )
        if window >= self.ack_timeout_seconds:
            given = self.results_stream_duplicate_window_seconds is not None
            raise ConfigError(
                f"RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS: must be shorter than "
                f"ACK_TIMEOUT_SECONDS ({self.ack_timeout_seconds:g}), got {window:g}"
                f"{'' if given else ' (not given: the server minimum of 0.1 s)'}: a service's ack "
                "to a republished request carries the first ack's Nats-Msg-Id, and the "
                "stream would drop it as a duplicate"
            )

    def __repr__(self) -> str:
        """Every field, with passwords, tokens, the seed and the JWT as ***."""
        shown: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.database_url:
            shown["database_url"] = mask_url(self.database_url)
        shown["nats_urls"] = tuple(mask_url(u, bare_user_is_secret=True) for u in self.nats_urls)
        for name in ("nats_seed", "nats_jwt"):
            shown[name] = "***" if shown[name] else ""
        shown["api_tokens"] = tuple(t._replace(token="***") for t in self.api_tokens)
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def secrets(self) -> tuple[str, ...]:
        """Every secret value configured — passwords of DATABASE_URL and NATS_URL (as
        written and percent-decoded), a token in a NATS URL, the NATS seed and JWT, the
        API tokens — for arm_core.logs.Redactor to keep out of every line."""
        found: list[str] = []
        if self.database_url:
            found += url_secrets(self.database_url, bare_user_is_secret=False)
            with contextlib.suppress(psycopg.Error):
                params = conninfo_to_dict(self.database_url)
                found += [str(params[k]) for k in ("password", "sslpassword") if params.get(k)]
        for url in self.nats_urls:
            found += url_secrets(url, bare_user_is_secret=True)
        found += [s for s in (self.nats_seed, self.nats_jwt) if s]
        found += [t.token for t in self.api_tokens]
        return tuple(dict.fromkeys(found))

    def unlevelled_tokens(self) -> tuple[ApiToken, ...]:
        """API_TOKENS entries that name no level (each holds every level, for now)."""
        if self.auth_mode != "token":
            return ()
        return tuple(t for t in self.api_tokens if t.level is None)

    def require_safe_exposure(self) -> None:
        """AUTH_MODE=none off loopback needs AUTH_ALLOW_ANONYMOUS=true
        (arm_core.config_access.require_safe_exposure)."""
        config_access.require_safe_exposure(self)

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigError(
                "DATABASE_URL: required (postgresql://user@host:port/dbname, or several "
                "hosts: postgresql://user@host1:5432,host2:5432/dbname"
                "?target_session_attrs=read-write)"
            )
        return self.database_url

    def subject_for(self, pipeline: str) -> str:
        """The request subject of a pipeline: tabular → files.tabular_uploaded, image → …"""
        if pipeline == "tabular":
            return self.tabular_request_subject
        if pipeline == "image":
            return self.image_request_subject
        raise ValueError(f"unknown pipeline {pipeline!r}")
