"""Configuration from the environment (docs/behaviour.md#configuration).

Every variable is parsed once at start. A bad value raises :class:`ConfigError` whose
message names the variable, so a misconfigured container fails at once and says why.

:class:`Settings` declares each variable with :func:`env_var` and reads them all with
:func:`read_env` (arm_core.config_env, the one environment parser, which the dev tools'
``REFERENCE_*`` configuration uses too). The parsers of its variables and the checks
that span several live beside it, by topic: arm_core.config_access (AUTH_MODE, tokens,
groups), arm_core.config_connections (DATABASE_URL, NATS_URL, subjects, ports, TLS
files) and arm_core.config_bridge (the pool, the inbox, liveness, the results stream).
Secrets are masked in its messages by arm_core.redaction; the NATS seed and JWT are
checked by arm_core.nats_credentials.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from arm_core import config_access, config_bridge, config_connections
from arm_core.access import METRICS_AUTH_MODES, ApiToken
from arm_core.config_access import (
    AUTH_MODES,
    is_loopback,
    parse_groups,
    parse_header,
    parse_tokens,
)
from arm_core.config_bridge import (
    CONFIRM_FLUSH_SECONDS,
    IDLE_IN_TRANSACTION_TIMEOUT_SECONDS,
    POOL_RESERVE,
    PUBLISH_CONFIRM_SECONDS,
    parse_idle_in_transaction,
    parse_replicas,
    parse_stream_name,
)
from arm_core.config_connections import (
    check_pooler,
    parse_database_url,
    parse_nats_urls,
    parse_path,
    parse_pooler,
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

_POSITIVE = number(float, 0.001)
LOG_FORMATS = ("text", "json")
PACING_MODES = ("auto", "fixed", "off")


@dataclass(frozen=True, repr=False)
class Settings:
    """Everything the processes read from the environment, with its defaults
    (docs/behaviour.md#configuration)."""

    database_url: str | None = env_var("DATABASE_URL", parse_database_url, None)
    # The bridge's LISTEN session's own URL (listen_url()): a session of its own, so direct
    # to PostgreSQL when DATABASE_URL goes through a transaction pooler. None: DATABASE_URL.
    database_listen_url: str | None = env_var("DATABASE_LISTEN_URL", parse_database_url, None)
    # What DATABASE_URL goes through (arm_core.config_connections.POOLERS): with
    # "transaction" the pool's connections prepare no statement and send no startup
    # options, LISTEN needs DATABASE_LISTEN_URL, and `migrate` refuses to run.
    database_pooler: str = env_var("DATABASE_POOLER", parse_pooler, "none")
    db_pool_timeout_seconds: float = env_var("DATABASE_POOL_TIMEOUT_SECONDS", _POSITIVE, 5.0)
    # The most connections the process's pool opens; None: enough for the bridge's loops
    # and POOL_RESERVE (pool_max_size()).
    db_pool_max_size: int | None = env_var("DATABASE_POOL_MAX_SIZE", number(int, 1), None)
    # The server ends a session left idle inside a transaction this long (every session:
    # arm_core.db.connection_options); 0 leaves the server's setting, and an
    # idle_in_transaction_session_timeout in DATABASE_URL's options wins.
    db_idle_in_transaction_timeout_seconds: float = env_var(
        "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS",
        parse_idle_in_transaction,
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
    # How many jobs of a pipeline are in its service's hands at once (docs/pacing.md):
    # auto adapts the limit to the service between the pipeline's MIN and MAX; fixed is
    # MAX; off publishes every queued job at once.
    pacing: str = env_var("PACING", one_of(PACING_MODES), "auto")
    tabular_min_in_flight: int = env_var("TABULAR_MIN_IN_FLIGHT", number(int, 1), 1)
    tabular_max_in_flight: int = env_var("TABULAR_MAX_IN_FLIGHT", number(int, 1), 1000)
    image_min_in_flight: int = env_var("IMAGE_MIN_IN_FLIGHT", number(int, 1), 1)
    image_max_in_flight: int = env_var("IMAGE_MAX_IN_FLIGHT", number(int, 1), 1000)
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
    results_stream: str = env_var("RESULTS_STREAM", parse_stream_name, "")
    results_stream_replicas: int = env_var("RESULTS_STREAM_REPLICAS", parse_replicas, 1)
    results_stream_max_age_seconds: float = env_var(
        "RESULTS_STREAM_MAX_AGE_SECONDS", number(float, 1), 7 * 24 * 3600.0
    )
    # The stream's byte limit. It holds only what no bridge has applied yet (interest
    # retention) and refuses new messages when full (discard new): at least 1 MiB, the
    # largest message a default nats-server takes.
    results_stream_max_bytes: int = env_var(
        "RESULTS_STREAM_MAX_BYTES", number(int, 1 << 20), 1 << 30
    )
    # None: 30 s (stream_ack_wait_seconds); a given one may not exceed ACK_TIMEOUT_SECONDS.
    results_stream_ack_wait_seconds: float | None = env_var(
        "RESULTS_STREAM_ACK_WAIT_SECONDS", number(float, 1), None
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
    # Names of the variables that were given explicitly (not defaulted).
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        # An (actor, token) pair given in code (tests, tools) is an entry without a level.
        tokens = tuple(t if isinstance(t, ApiToken) else ApiToken(*t) for t in self.api_tokens)
        object.__setattr__(self, "api_tokens", tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Reads every variable; raises ConfigError naming the first bad one."""
        environ = os.environ if environ is None else environ
        values, given = read_env(cls, environ)
        settings = cls(**values, explicit=given)
        check_pooler(settings, environ.get("PGOPTIONS", ""))
        config_access.check_access(settings)
        nats_keypair(settings.nats_seed, settings.nats_jwt)
        config_bridge.check_inbox(settings)
        config_bridge.check_liveness(settings)
        config_bridge.check_pacing(settings)
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
        """The pool's max_size (arm_core.config_bridge.pool_max_size)."""
        return config_bridge.pool_max_size(self)

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

    @property
    def duplicate_window_seconds(self) -> float:
        """The results stream's duplicate window, shorter than ACK_TIMEOUT_SECONDS
        (arm_core.config_bridge.duplicate_window_seconds)."""
        return config_bridge.duplicate_window_seconds(self)

    @property
    def stream_ack_wait_seconds(self) -> float:
        """The results stream consumer's ack_wait
        (arm_core.config_bridge.stream_ack_wait_seconds)."""
        return config_bridge.stream_ack_wait_seconds(self)

    def check_results_stream(self) -> None:
        """RESULTS_STREAM's settings fit together (arm_core.config_bridge.check_results_stream)."""
        config_bridge.check_results_stream(self)

    def __repr__(self) -> str:
        """Every field, with passwords, tokens, the seed and the JWT as ***."""
        shown: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("database_url", "database_listen_url"):
            if shown[name]:
                shown[name] = mask_url(shown[name])
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
        for url in (self.database_url, self.database_listen_url):
            if not url:
                continue
            found += url_secrets(url, bare_user_is_secret=False)
            with contextlib.suppress(psycopg.Error):
                params = conninfo_to_dict(url)
                found += [str(params[k]) for k in ("password", "sslpassword") if params.get(k)]
        for url in self.nats_urls:
            found += url_secrets(url, bare_user_is_secret=True)
        found += [s for s in (self.nats_seed, self.nats_jwt) if s]
        found += [t.token for t in self.api_tokens]
        return tuple(dict.fromkeys(found))

    def unlevelled_tokens(self) -> tuple[ApiToken, ...]:
        """API_TOKENS entries that name no level (each holds every level until 2.0)."""
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

    @property
    def transaction_pooler(self) -> bool:
        """DATABASE_URL goes through a transaction pooler (DATABASE_POOLER=transaction)."""
        return self.database_pooler == "transaction"

    def listen_url(self) -> str:
        """The bridge's LISTEN URL (arm_core.config_connections.listen_url)."""
        return config_connections.listen_url(self)

    def require_session_url(self, command: str) -> str:
        """DATABASE_URL for `command`, which needs a session of its own for its whole run
        (arm_core.config_connections.session_url)."""
        return config_connections.session_url(self, command)

    def subject_for(self, pipeline: str) -> str:
        """The request subject of a pipeline: tabular → files.tabular_uploaded, image → …"""
        if pipeline == "tabular":
            return self.tabular_request_subject
        if pipeline == "image":
            return self.image_request_subject
        raise ValueError(f"unknown pipeline {pipeline!r}")
