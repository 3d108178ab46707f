"""Configuration from the environment: :class:`Settings`, one pydantic-settings model.

Each variable is one field, written once: its type, its parser, its default, and its
meaning (docs/configuration.md, written by `make docs`); the rules that span several are
its validator. :meth:`Settings.from_env` reads them at start; a bad value raises
:class:`ConfigError` naming the variable and quoting no secret (exit 2). A Settings made
in code (tests, tools) is taken as given: the tests run with periods no deployment would
want.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import re
import ssl
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Annotated, Any, Self, TypeVar
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic.json_schema import JsonDict
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from arm_core.access import LEVELS, ApiToken, Level
from arm_core.config_error import ConfigError
from arm_core.nats_credentials import JWT_VAR, SEED_VAR, nats_keypair
from arm_core.redaction import mask_url, mask_urls_in, url_secrets
from arm_core.tls import check_certificates, load_pair

N = TypeVar("N", int, float)

# --- parsers: the raw text of a variable → its value, or ValueError saying why (the
# variable's name is put in front of the message by from_env; no secret is quoted) ---


def number(
    kind: Callable[[str], N], minimum: float | None = None, maximum: float | None = None
) -> Callable[[str], N]:
    """An int or float parser; nan and inf are not numbers here."""

    def parse(raw: str) -> N:
        try:
            value = kind(raw.strip())
            if not math.isfinite(value):
                raise ValueError
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
        if minimum is not None and value < minimum:
            raise ValueError(f"must be at least {minimum}, got {raw!r}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum}, got {raw!r}")
        return value

    return parse


def one_of(
    options: tuple[str, ...], fold: Callable[[str], str] = str.lower
) -> Callable[[str], str]:
    """One of `options`, compared after stripping and `fold` (lower-case by default)."""

    def parse(raw: str) -> str:
        value = fold(raw.strip())
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {raw!r}")
        return value

    return parse


def parse_database_url(raw: str) -> str:
    """A libpq connection string: a postgresql:// URL or the key=value form."""
    value = raw.strip()
    scheme, sep, _ = value.partition("://")
    is_url, is_keywords = bool(sep), not sep and "=" in value
    if (is_url and scheme not in ("postgresql", "postgres")) or not (is_url or is_keywords):
        raise ValueError(
            f"expected a postgresql://… URL or libpq's key=value form, got {mask_url(value)!r}"
        )
    try:  # libpq's own parser: a string it cannot read fails here, not at the first query
        conninfo_to_dict(value)
    except psycopg.Error as exc:
        # libpq quotes the part it could not read, which may be the password.
        said = str(exc).strip()
        for secret in url_secrets(value, bare_user_is_secret=False):
            said = said.replace(secret, "***")
        raise ValueError(
            f"not a valid connection string ({mask_url(value)!r}): {mask_urls_in(said)}"
        ) from None
    return value


# DATABASE_POOLER's values. Said, not detected: PgBouncer does not tell a client it is
# there (a regular connection's SHOW pool_mode reaches PostgreSQL; only its admin console
# answers), other poolers answer differently again, and one client seeing the same
# backend twice proves nothing.
POOLERS = ("none", "transaction")


_REFUSED_POOLERS = {
    "statement": "statement pooling cannot work: the bridge's transactions span several "
    "statements (the publisher's claim, NATS's confirmation, the commit); use "
    "pool_mode = transaction",
    "session": "a session pooler is the same to arm-core as PostgreSQL itself: leave "
    "DATABASE_POOLER unset (none); see docs/dbas.md#through-pgbouncer for its startup options",
}


def parse_pooler(raw: str) -> str:
    if refused := _REFUSED_POOLERS.get(raw.strip().lower()):
        raise ValueError(refused)
    return one_of(POOLERS)(raw)


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def parse_nats_urls(raw: str) -> tuple[str, ...]:
    urls = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not urls:
        raise ValueError("expected one or more nats://host:port URLs")
    for url in urls:
        shown = mask_url(url, bare_user_is_secret=True)
        try:
            parts = urlsplit(url)
            if parts.scheme not in NATS_SCHEMES or not parts.hostname:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"not a NATS URL ({'|'.join(NATS_SCHEMES)}://host:port): {shown!r}"
            ) from None
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise ValueError(f"bad port in {shown!r}") from None
    if len({urlsplit(url).scheme in ("ws", "wss") for url in urls}) > 1:  # nats-py refuses it
        raise ValueError("websocket (ws, wss) and nats/tls URLs cannot be mixed")
    return urls


def matching(pattern: str, what: str) -> Callable[[str], str]:
    """A parser of a name that must match `pattern` whole, after stripping."""

    def parse(raw: str) -> str:
        value = raw.strip()
        if not re.fullmatch(pattern, value):
            raise ValueError(f"not {what}: {raw!r}")
        return value

    return parse


AUTH_MODES = ("none", "token", "header")


def parse_tokens(raw: str) -> tuple[ApiToken, ...]:
    """`actor:level=token,actor2=token2` → (ApiToken, …): `:level` (viewer, operator or
    metrics) is optional; an entry without one has every level, as before levels
    existed. A bad entry is named by its position: any part of it may be a token."""
    entries = [part.strip() for part in raw.split(",") if part.strip()]
    parsed: list[ApiToken] = []
    for n, entry in enumerate(entries, 1):
        who, sep, token = entry.partition("=")
        who, token = who.strip(), token.strip()
        where = f"entry {n} of {len(entries)}"
        if not sep:
            raise ValueError(f"{where}: expected actor:level=token (no = in it)")
        actor, colon, level = who.rpartition(":") if ":" in who else (who, "", "")
        actor, level = actor.strip(), level.strip()
        if not actor:
            raise ValueError(f"{where}: expected actor:level=token (the actor is empty)")
        if colon and level not in LEVELS:
            # Not quoted: whatever stands there may be part of a token put in the wrong place.
            raise ValueError(
                f"{where}: the access level after ':' is not one of {', '.join(LEVELS)}"
            )
        if len(token) < 16:
            raise ValueError(f"{where}: the token is shorter than 16 characters")
        for m, earlier in enumerate(parsed, 1):
            if earlier.token == token:
                levels = {earlier.level or "every level", level or "every level"}
                other = f", with another level ({' and '.join(sorted(levels))})"
                raise ValueError(
                    f"{where}: the same token as entry {m}{other if len(levels) > 1 else ''}"
                    "; the audit could not tell who"
                )
        parsed.append(ApiToken(actor, token, Level(level) if colon else None))
    return tuple(parsed)


def parse_groups(raw: str) -> frozenset[str]:
    """`group,group2` → the set of group names (as the groups header lists them)."""
    groups = frozenset(part.strip() for part in raw.split(",") if part.strip())
    if raw.strip() and not groups:
        raise ValueError("expected comma-separated group names")
    return groups


# A JetStream stream or consumer name: what every server version accepts (no `.`, `*`,
# `>`, path separators or spaces).
_JS_NAME = r"[A-Za-z0-9_-]{1,64}"


# The pool's connections beside the bridge's loops (DATABASE_POOL_MAX_SIZE): each request,
# check or scrape holds one for a few milliseconds, so four let a health check and a scrape
# run beside two requests; a burst beyond that waits its turn rather than costing sessions.
POOL_RESERVE = 4

# The longest the processes sit idle inside a transaction on purpose: the publisher
# claims jobs, publishes them and waits for NATS's confirmation (bridge/nats_client.py
# confirm: two flushes of up to CONFIRM_FLUSH_SECONDS each) before it commits.
CONFIRM_FLUSH_SECONDS = 5
PUBLISH_CONFIRM_SECONDS = 2 * CONFIRM_FLUSH_SECONDS
# DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS' default: twice the publisher's longest
# legitimate idle, so a slow NATS never gets a healthy publish's session ended, and well
# under a minute, so a session cut off mid-transaction gives back its locks in seconds.
IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = 20.0


def parse_idle_in_transaction(raw: str) -> float:
    # At most what PostgreSQL takes: milliseconds as a 32-bit integer (about 24.8 days).
    value = number(float, 0, (2**31 - 1) // 1000)(raw)
    if 0 < value <= PUBLISH_CONFIRM_SECONDS:
        raise ValueError(
            f"must be 0 (the server's setting) or more than {PUBLISH_CONFIRM_SECONDS:g} s, "
            f"the publisher's wait for NATS's confirmation inside its transaction, got {raw!r}"
        )
    return value


# The environment from_env is reading, while it validates what it read: its text is
# parsed and its rules checked; a value given in code is taken as it is.
_READING: ContextVar[Mapping[str, str] | None] = ContextVar("reading", default=None)


def parsed(parse: Callable[[str], Any]) -> BeforeValidator:
    """A field's parser, for the text of an environment variable."""
    return BeforeValidator(
        lambda value: (
            parse(value) if _READING.get() is not None and isinstance(value, str) else value
        )
    )


# The kinds of value most variables are.
Flag = Annotated[bool, parsed(str.strip)]  # pydantic's: true, false, 1, 0, yes, no, on, off
Seconds = Annotated[float, parsed(number(float, 0.001))]
Count = Annotated[int, parsed(number(int, 1))]
Natural = Annotated[int, parsed(number(int, 0))]  # a count that may be 0
Kibibytes = Annotated[int, parsed(number(int, 1024))]  # a size in bytes, at least 1 KiB
LongSeconds = Annotated[float, parsed(number(float, 1))]  # a second or more
Port = Annotated[int, parsed(number(int, 0, 65535))]
# No space and no empty token but a last one: "a.b" and "a.", not ".a", "a..b" or "a b".
Subject = Annotated[str, parsed(matching(r"[^\s.]+(\.[^\s.]+)*\.?", "a NATS subject"))]
Header = Annotated[str, parsed(matching(r"([^\W_]|-)+", "an HTTP header name"))]
Groups = Annotated[frozenset[str], parsed(parse_groups)]
Stripped = Annotated[str, parsed(str.strip)]
DatabaseUrl = Annotated[str | None, parsed(parse_database_url)]

# An empty variable counts as not given, but for a field with this in json_schema_extra.
BLANK_IS_A_VALUE: JsonDict = {"blank_is_a_value": True}


def _config_error(exc: ValidationError) -> ConfigError:
    """The first error, as `VARIABLE: what is wrong`."""
    error = exc.errors()[0]
    said = str(error.get("ctx", {}).get("error") or error["msg"])  # a parser's words
    name = ".".join(str(part) for part in error["loc"])  # empty: a rule of several
    return ConfigError(f"{name}: {said}" if name else said)


class EnvSettings(BaseSettings):
    """Settings read from the environment variables their fields' aliases name (each
    subclass's from_env); made in code, by field name, they are taken as given."""

    model_config = SettingsConfigDict(
        frozen=True,
        hide_input_in_errors=True,
        validate_by_name=True,
        validate_default=False,  # the defaults are values, not text to parse
        extra="forbid",
        use_attribute_docstrings=True,  # each field's docstring: its meaning
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only what the caller passes: from_env reads the environment it is given.
        return (init_settings,)

    @classmethod
    def _read(cls, environ: Mapping[str, str] | None, **given: Any) -> Self:
        """Every variable of `environ` a field names (a blank one is not given), checked;
        ConfigError names the first bad one. `given`: fields that are no variable."""
        environ = os.environ if environ is None else environ
        for field in cls.model_fields.values():
            name = field.alias or ""
            raw = environ.get(name)
            if raw is not None and (raw.strip() or field.json_schema_extra == BLANK_IS_A_VALUE):
                given[name] = raw
        reading = _READING.set(environ)
        try:
            return cls(**given)
        except ValidationError as exc:
            raise _config_error(exc) from None
        finally:
            _READING.reset(reading)

    @property
    def explicit(self) -> frozenset[str]:
        """The variables given (from the environment, or in code), not defaulted."""
        return frozenset(
            type(self).model_fields[name].alias or name for name in self.model_fields_set
        )


# The defaults the pool's size is computed from (DATABASE_POOL_MAX_SIZE's meaning).
_PUBLISHERS, _INBOX_WORKERS = 2, 2
_DEFAULT_POOL = _PUBLISHERS + _INBOX_WORKERS + 1 + POOL_RESERVE


class Settings(EnvSettings):
    """Everything the processes read from the environment, with its defaults."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Every variable of `environ` (os.environ by default), checked."""
        return cls._read(environ)

    database_url: DatabaseUrl = Field(None, alias="DATABASE_URL")
    """`postgresql://user:pass@host:port/db` (required by `migrate`, `serve` and `bridge`; `dev`
    runs its own, `reference` and `healthcheck` read none); over the network add
    `?sslmode=verify-full&sslrootcert=/path/ca.crt` (and `sslcert`, `sslkey` where the server
    asks for client certificates): [Encryption in transit](security.md#encryption-in-transit)"""
    database_listen_url: DatabaseUrl = Field(None, alias="DATABASE_LISTEN_URL")
    """the URL of the bridge's LISTEN session (of `serve` with `NATS_ENABLED=true` and of
    `bridge`), which wakes the publisher on a `NOTIFY`: a session of its own, so direct to
    PostgreSQL when `DATABASE_URL` goes through a transaction pooler; checked as `DATABASE_URL`.
    Unset: `DATABASE_URL`. While it is down `/readyz` says `listen` and jobs go out at each
    `OUTBOX_POLL_SECONDS` poll: [Through PgBouncer](dbas.md#through-pgbouncer)"""
    database_pooler: Annotated[str, parsed(parse_pooler)] = Field("none", alias="DATABASE_POOLER")
    """what `DATABASE_URL` goes through: `none` (PostgreSQL itself, or a pooler in session mode,
    the same to arm-core) · `transaction` (PgBouncer's `pool_mode = transaction`, a server
    session per transaction): the pool's connections prepare no statement (psycopg's
    `prepare_threshold=None`) and send no startup option, so
    `DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS` does not reach them (the pooler's
    `idle_transaction_timeout` does that) and options in `DATABASE_URL` or `PGOPTIONS` stop the
    process at start; `DATABASE_LISTEN_URL` is required (not the same URL); `migrate` and
    `rollback` refuse to run (exit 2): run them direct. Said, not detected: a pooler does not
    tell its clients it is there. `statement` (cannot work) and `session` (leave it `none`) are
    refused: [Through PgBouncer](dbas.md#through-pgbouncer)"""
    db_pool_timeout_seconds: Seconds = Field(5.0, alias="DATABASE_POOL_TIMEOUT_SECONDS")
    """how long a request waits for a database connection before 503"""
    db_pool_max_size: Count | None = Field(
        None,
        alias="DATABASE_POOL_MAX_SIZE",
        description="the most connections the process's pool opens, shared by the API's requests, "
        "`/healthcheck`, `/metrics` and the bridge's loops. Unset: with `NATS_ENABLED=true`, "
        f"`OUTBOX_PUBLISHERS + INBOX_WORKERS + 1 + {POOL_RESERVE}` (one connection per publisher "
        f"and per inbox worker, one for the schedule runner, {POOL_RESERVE} for the API, health "
        f"checks and scrapes), which is {_DEFAULT_POOL} with the defaults; with "
        f"`NATS_ENABLED=false`, {POOL_RESERVE}. Not from the pool: the bridge's LISTEN connection "
        "and `arm-core migrate`'s, one each. A value below the bridge's loops plus 1 stops the "
        "process at start (exit 2). A request that finds every connection in use for "
        "`DATABASE_POOL_TIMEOUT_SECONDS` gets `503 DATABASE_POOL_EXHAUSTED` (not an outage: "
        "[Logs](logs-and-metrics.md#logs)). Every process opens up to this many sessions plus "
        "its LISTEN one: keep their sum under the server's `max_connections`",
        json_schema_extra={"shown_default": f"{_DEFAULT_POOL} (computed)"},
    )
    db_idle_in_transaction_timeout_seconds: Annotated[float, parsed(parse_idle_in_transaction)] = (
        Field(
            IDLE_IN_TRANSACTION_TIMEOUT_SECONDS,
            alias="DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS",
            description="every session the processes open (the pool's — not through a "
            "transaction pooler: `DATABASE_POOLER` —, the bridge's LISTEN connection, `arm-core "
            "migrate`'s) sets PostgreSQL's `idle_in_transaction_session_timeout` to this, so the "
            "server ends a session left idle inside a transaction that long (a process whose "
            "network path to PostgreSQL went silent mid-transaction no longer holds its snapshot "
            "and row locks for hours); above the publisher's longest wait inside a transaction, "
            f"NATS's confirmation ({PUBLISH_CONFIRM_SECONDS:g} s), or the process stops at start "
            "(exit 2). `0`: the server's setting. A `DATABASE_URL` whose `options` set it "
            "(`options=-c idle_in_transaction_session_timeout=…`) wins; its other options are "
            "kept. See also the server's TCP keepalives: "
            "[For DBAs](dbas.md#connections-and-dead-clients)",
        )
    )
    nats_urls: Annotated[tuple[str, ...], parsed(parse_nats_urls)] = Field(
        ("nats://127.0.0.1:4222",), alias="NATS_URL"
    )
    """NATS server URL(s), comma-separated (every node of a cluster: [On a NATS
    cluster](not-losing-answers.md#on-a-nats-cluster))"""
    nats_enabled: Flag = Field(True, alias="NATS_ENABLED")
    """start the bridge's tasks (publisher, inbox, schedule) in `serve`"""
    debug: Flag = Field(False, alias="DEBUG")
    """debug logs"""
    log_format: Annotated[str, parsed(one_of(("text", "json")))] = Field("text", alias="LOG_FORMAT")
    """`text` (key=value lines for people) or `json` (one JSON object a line, for Loki/ELK); see
    [Logs](logs-and-metrics.md#logs)"""
    nats_seed: Annotated[SecretStr, parsed(str.strip)] = Field(SecretStr(""), alias=SEED_VAR)
    """a user nkey seed (`SU…`): alone, nkey auth; with `OPENBAO__NATS__NATS_JWT`, JWT auth; both
    empty: no credentials (checked at start, see above)"""
    nats_jwt: Annotated[SecretStr, parsed(str.strip)] = Field(SecretStr(""), alias=JWT_VAR)
    """the user JWT issued to the seed's key, for JWT auth; needs `OPENBAO__NATS__NATS_SEED`
    (checked at start, see above)"""
    outbox_poll_seconds: Seconds = Field(5.0, alias="OUTBOX_POLL_SECONDS")
    """publisher poll period (NOTIFY wakes it sooner)"""
    outbox_batch_size: Count = Field(500, alias="OUTBOX_BATCH_SIZE")
    """jobs per publish transaction"""
    outbox_publishers: Count = Field(_PUBLISHERS, alias="OUTBOX_PUBLISHERS")
    """publish batches in flight at once per process (one claims while another waits for its
    confirmation)"""
    ack_timeout_seconds: Seconds = Field(30.0, alias="ACK_TIMEOUT_SECONDS")
    """republish after this long without an ack"""
    outbox_max_republish: Natural = Field(3, alias="OUTBOX_MAX_REPUBLISH")
    """republishes before `dlq`"""
    pacing: Annotated[str, parsed(one_of(("auto", "fixed", "off")))] = Field("auto", alias="PACING")
    """how many jobs of a pipeline its service holds at once (docs/pacing.md): `auto` adapts the
    limit to the service's answers between the pipeline's MIN and MAX · `fixed`: the pipeline's
    MAX · `off`: every queued job published at once"""
    tabular_min_in_flight: Count = Field(1, alias="TABULAR_MIN_IN_FLIGHT")
    """the floor of the tabular pipeline's in-flight limit (`auto`): where it starts, and where
    it falls when the service stops answering"""
    tabular_max_in_flight: Count = Field(1000, alias="TABULAR_MAX_IN_FLIGHT")
    """the ceiling of the tabular pipeline's in-flight limit (`auto`); the limit itself with
    `fixed`; at least its MIN"""
    image_min_in_flight: Count = Field(1, alias="IMAGE_MIN_IN_FLIGHT")
    """as TABULAR_MIN_IN_FLIGHT, for the image pipeline"""
    image_max_in_flight: Count = Field(1000, alias="IMAGE_MAX_IN_FLIGHT")
    """as TABULAR_MAX_IN_FLIGHT, for the image pipeline"""
    timeout_sweep_seconds: LongSeconds = Field(30.0, alias="TIMEOUT_SWEEP_SECONDS")
    """sweep period; when set, written to `arm.periodic_task` once the bridge reaches the
    database (otherwise a DBA's value stands)"""
    schedule_tick_seconds: Seconds = Field(1.0, alias="SCHEDULE_TICK_SECONDS")
    """how often a bridge asks the database what is due"""
    tabular_reply_timeout_seconds: Seconds = Field(600.0, alias="TABULAR_REPLY_TIMEOUT_SECONDS")
    """a tabular job's `reply_deadline = publish time + this`"""
    image_reply_timeout_seconds: Seconds = Field(1800.0, alias="IMAGE_REPLY_TIMEOUT_SECONDS")
    """an image job's `reply_deadline = publish time + this`"""
    default_max_attempts: Count = Field(3, alias="DEFAULT_MAX_ATTEMPTS")
    """`max_attempts` of new uploads; when set, `arm-core migrate` writes it to `arm.setting`
    (otherwise the stored value, 3 at first, stands)"""
    http_host: Stripped = Field("127.0.0.1", alias="HTTP_HOST", json_schema_extra=BLANK_IS_A_VALUE)
    """API listen address (and of the bridge's health port); off loopback, `serve` needs
    `AUTH_MODE` `token` or `header`, or `AUTH_ALLOW_ANONYMOUS=true`"""
    http_port: Port = Field(8080, alias="HTTP_PORT")
    """API port of `arm-core serve`"""
    bridge_health_port: Port = Field(8081, alias="BRIDGE_HEALTH_PORT")
    """health port of `arm-core bridge`"""
    tabular_request_subject: Subject = Field(
        "files.tabular_uploaded", alias="TABULAR_REQUEST_SUBJECT"
    )
    """request subject of tabular jobs"""
    image_request_subject: Subject = Field("files.img_uploaded", alias="IMAGE_REQUEST_SUBJECT")
    """request subject of image jobs"""
    result_subject: Subject = Field("files.tabular_parsed", alias="RESULT_SUBJECT")
    """inbox subject (acks and results)"""
    nats_queue_group: Subject = Field("arm-core", alias="NATS_QUEUE_GROUP")
    """inbox queue group (and, with `RESULTS_STREAM`, the durable consumer's name)"""
    inbox_max_payload_bytes: Kibibytes = Field(1 << 20, alias="INBOX_MAX_PAYLOAD_BYTES")
    """larger envelopes are dropped (logged)"""
    inbox_buffer_size: Count = Field(10_000, alias="INBOX_BUFFER_SIZE")
    """envelopes the inbox's buffers hold, at most, while a worker is behind or the database is
    away; at least `INBOX_WORKERS` ([The inbox buffer](behaviour.md#the-inbox-buffer))"""
    # The default fits a 256 MiB container (with RESULTS_STREAM about twice this: each
    # message is kept until acked).
    inbox_buffer_bytes: Annotated[int, parsed(number(int, 1 << 16))] = Field(
        32 << 20, alias="INBOX_BUFFER_BYTES"
    )
    """the bytes those envelopes came as, at most: the bound on what answers take in memory; at
    least `INBOX_WORKERS` × `INBOX_MAX_PAYLOAD_BYTES` ([The inbox
    buffer](behaviour.md#the-inbox-buffer))"""
    inbox_workers: Count = Field(_INBOX_WORKERS, alias="INBOX_WORKERS")
    """inbox workers, each applying its own batches on its own connection; a job's envelopes
    always go to the same worker (order per job holds) and each has its share of
    `INBOX_BUFFER_SIZE` and `INBOX_BUFFER_BYTES`"""
    inbox_batch_size: Count = Field(500, alias="INBOX_BATCH_SIZE")
    """most envelopes applied in one transaction"""
    outbox_stuck_seconds: Seconds = Field(60.0, alias="OUTBOX_STUCK_SECONDS")
    """oldest job ready to publish (not held back by pacing) older than this (NATS up) → health
    `degraded`, `outbox: stuck: …`"""
    retry_batch_max: Count = Field(1000, alias="RETRY_BATCH_MAX")
    """most file ids in one batch retry"""
    http_max_body_bytes: Kibibytes = Field(256 * 1024, alias="HTTP_MAX_BODY_BYTES")
    """larger request bodies get 413"""
    http_header_timeout_seconds: Seconds = Field(10.0, alias="HTTP_HEADER_TIMEOUT_SECONDS")
    """a connection must deliver a complete request line and headers within this of its opening
    or of the answer to its previous request; else it is closed without an answer (aiohttp's
    `keepalive_timeout`, which also closes a keep-alive connection left idle that long; `serve`
    and the `bridge` health port)"""
    http_body_timeout_seconds: Seconds = Field(30.0, alias="HTTP_BODY_TIMEOUT_SECONDS")
    """a handler that reads a body must have it within this; else a JSON `408` and the connection
    is closed. A body no handler reads is thrown away after the answer for at most this long
    (aiohttp's `lingering_time`)"""
    auth_allow_anonymous: Flag = Field(False, alias="AUTH_ALLOW_ANONYMOUS")
    """`true`: `serve` may run `AUTH_MODE=none` on a non-loopback `HTTP_HOST` (anyone who reaches
    it may retry, audited as `anonymous`)"""
    auth_mode: Annotated[str, parsed(one_of(AUTH_MODES))] = Field("none", alias="AUTH_MODE")
    """`none`, `token` (`API_TOKENS`) or `header` (`AUTH_HEADER`): who a caller is (the retry
    audit names it) and which [access levels](security.md#access-levels) it holds; `none`:
    everyone holds every level"""
    api_tokens: Annotated[tuple[ApiToken, ...], parsed(parse_tokens)] = Field(
        (),
        alias="API_TOKENS",
        description="`actor:level=token,actor2:level=token2` for `AUTH_MODE=token`: level "
        f"{', '.join(f'`{level}`' for level in LEVELS)}, tokens of 16+ characters, no token "
        "twice. An entry without `:level` holds every level (logged at start, `action=deprecated`) "
        "until 2.0, which refuses it ([Access levels](security.md#access-levels))",
    )
    auth_header: Header = Field("X-Forwarded-User", alias="AUTH_HEADER")
    """identity header set by an authenticating proxy, for `AUTH_MODE=header` (only behind such a
    proxy: anyone reaching the port directly can claim any identity)"""
    auth_groups_header: Header = Field("", alias="AUTH_GROUPS_HEADER")
    """`AUTH_MODE=header` only: the header in which the proxy lists the caller's groups,
    comma-separated (oauth2-proxy: `X-Forwarded-Groups`); set, a caller's groups give its levels
    and a caller in none of the groups below gets 403; empty: every identified caller holds every
    level. Needs at least one of the group lists, and must differ from `AUTH_HEADER` ([Access
    levels](security.md#access-levels))"""
    auth_operator_groups: Groups = Field(frozenset(), alias="AUTH_OPERATOR_GROUPS")
    """groups (comma-separated) whose members hold `operator`: read and retry; needs
    `AUTH_GROUPS_HEADER`"""
    auth_viewer_groups: Groups = Field(frozenset(), alias="AUTH_VIEWER_GROUPS")
    """groups (comma-separated) whose members hold `viewer`: read only; needs
    `AUTH_GROUPS_HEADER`"""
    auth_metrics_groups: Groups = Field(frozenset(), alias="AUTH_METRICS_GROUPS")
    """groups (comma-separated) whose members hold `metrics`: `GET /metrics` only; needs
    `AUTH_GROUPS_HEADER`"""
    metrics_auth: Annotated[str, parsed(one_of(("level", "any", "none")))] = Field(
        "level", alias="METRICS_AUTH"
    )
    """what `GET /metrics` of `serve` asks: `level`, a caller of level `metrics` (anyone with
    `AUTH_MODE=none`); `any`, any caller the API accepts; `none`, no credentials (a scrape on a
    private network). The probes never ask, nor does the bridge's health port"""
    results_stream: Annotated[
        str, parsed(matching(_JS_NAME, "a JetStream stream name (1 to 64 of A-Z a-z 0-9 _ -)"))
    ] = Field("", alias="RESULTS_STREAM")
    """the name of a JetStream stream that captures `RESULT_SUBJECT`; the core consumes it
    through one durable consumer named `NATS_QUEUE_GROUP` (see [The results
    stream](not-losing-answers.md#the-results-stream)). Needs a server with JetStream: without it
    the process exits 2 naming `RESULTS_STREAM`. Empty: off"""
    results_stream_replicas: Annotated[int, parsed(number(int, 1, 5))] = Field(
        1, alias="RESULTS_STREAM_REPLICAS"
    )
    """replicas (1–5) of the stream the core creates"""
    results_stream_max_age_seconds: LongSeconds = Field(
        7 * 24 * 3600.0, alias="RESULTS_STREAM_MAX_AGE_SECONDS"
    )
    """the stream removes a message older than this, applied or not (the default is 7 days; by
    then its job has long reached its reply deadline)"""
    # At least 1 MiB, the largest message a default nats-server takes.
    results_stream_max_bytes: Annotated[int, parsed(number(int, 1 << 20))] = Field(
        1 << 30, alias="RESULTS_STREAM_MAX_BYTES"
    )
    """the stream's byte limit, per replica on each node (at least 1 MiB; the default is 1 GiB);
    when full, the stream refuses new answers ([the stream's
    bounds](not-losing-answers.md#the-streams-bounds)). The server reserves it from its
    `max_file_store` ([Capacity](capacity.md#the-results-stream))"""
    results_stream_ack_wait_seconds: LongSeconds | None = Field(
        None, alias="RESULTS_STREAM_ACK_WAIT_SECONDS", json_schema_extra={"shown_default": "30"}
    )
    """how long the stream waits for a bridge to settle an answer it delivered before it delivers
    it to any bridge again (an answer waiting on its job's publish is kept meanwhile): what a
    bridge that died or was cut off held comes back after this; at least 1, at most
    `ACK_TIMEOUT_SECONDS` (else exit 2)"""
    results_stream_duplicate_window_seconds: Annotated[float | None, parsed(number(float, 0.1))] = (
        Field(
            None,
            alias="RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS",
            json_schema_extra={
                "shown_default": "a third of `ACK_TIMEOUT_SECONDS` (10 with its default), at "
                "most 120 and the maximum age, at least 0.1"
            },
        )
    )
    """the stream drops a message whose `Nats-Msg-Id` it stored within this (0.1 s or more, at
    most the maximum age); must be shorter than `ACK_TIMEOUT_SECONDS` (else exit 2), so that a
    service's ack to a republished request is stored ([For service
    teams](service-teams.md#for-service-teams))"""
    results_stream_replay_seconds: Annotated[float, parsed(number(float, 0))] = Field(
        15.0, alias="RESULTS_STREAM_REPLAY_SECONDS"
    )
    """with `RESULTS_STREAM`, each bridge also receives the answers by core NATS and keeps those
    of the last this many seconds in memory; when the stream elects a leader it applies them
    again, so that what services published with core NATS while the stream had none is not lost
    (duplicates are ignored; [Not losing answers](not-losing-answers.md#on-a-nats-cluster)); `0`:
    off"""
    nats_tls_ca_file: Stripped = Field("", alias="NATS_TLS_CA_FILE")
    """PEM file of the CA(s) that signed the NATS servers' certificates (a private CA); empty:
    the system's CAs. Setting any `NATS_TLS_*` (or a `tls://` URL) makes every NATS connection
    verify the server's certificate and name, TLS 1.2 or later"""
    nats_tls_cert_file: Stripped = Field("", alias="NATS_TLS_CERT_FILE")
    """PEM client certificate (with its chain) for servers that verify clients (mutual TLS);
    needs `NATS_TLS_KEY_FILE`"""
    nats_tls_key_file: Stripped = Field("", alias="NATS_TLS_KEY_FILE")
    """PEM private key of `NATS_TLS_CERT_FILE`, unencrypted, in a file only this process's user
    may read"""
    nats_tls_handshake_first: Flag = Field(False, alias="NATS_TLS_HANDSHAKE_FIRST")
    """`true`: the TLS handshake comes before the server's first message, so nothing is ever sent
    in clear, whatever answers at the address (the servers need `tls { handshake_first: true }`,
    nats-server 2.10.4 or later). `false`: TLS when the server announces it requires TLS, as
    every server with a `tls` block does"""
    http_tls_cert_file: Stripped = Field("", alias="HTTP_TLS_CERT_FILE")
    """PEM certificate (with its chain): `serve` and the bridge's health port answer HTTPS only
    (TLS 1.2 or later); empty: plain HTTP, for a TLS-terminating proxy in front"""
    http_tls_key_file: Stripped = Field("", alias="HTTP_TLS_KEY_FILE")
    """PEM private key of `HTTP_TLS_CERT_FILE`, unencrypted"""
    service_restart_limit: Natural = Field(5, alias="SERVICE_RESTART_LIMIT")
    """a loop of the bridge (publisher, an inbox worker, the listener, the schedule, the results
    stream's fetch or replay) that raises what it does not handle is logged
    (`action=service_crashed`) and restarted; one more crash than this within
    `SERVICE_RESTART_WINDOW_SECONDS` stops the process as SIGTERM would (draining) with exit code
    1, for its supervisor to start a fresh one"""
    service_restart_window_seconds: Seconds = Field(300.0, alias="SERVICE_RESTART_WINDOW_SECONDS")
    """the window of `SERVICE_RESTART_LIMIT`"""
    liveness_stall_seconds: LongSeconds = Field(180.0, alias="LIVENESS_STALL_SECONDS")
    """`GET /livez` (and so the image's `HEALTHCHECK`) fails when a loop of the bridge has not
    had a heartbeat for this long: it is stuck, and a restart helps; more than twice
    `DATABASE_POOL_TIMEOUT_SECONDS` (a loop waits that long for a connection while the database
    is away, which is no stall)"""

    @model_validator(mode="after")
    def _check_at_start(self) -> Self:
        """The rules that span several variables, and every TLS file read and checked:
        for the environment's settings (from_env), which stop the process at start."""
        environ = _READING.get()
        if environ is None:
            return self
        self._check_pooler(environ.get("PGOPTIONS", ""))
        self._check_access()
        nats_keypair(self.nats_seed.get_secret_value(), self.nats_jwt.get_secret_value())
        self._check_bounds()
        self.check_results_stream()
        self.pool_max_size()  # too small for the bridge's loops
        self.nats_tls_context()
        self.https_context()
        return self

    def _check_pooler(self, pgoptions: str) -> None:
        """No startup option reaches PostgreSQL through a transaction pooler (PgBouncer 1.18
        refuses `options` unless ignore_startup_parameters lists it, and then drops them)."""
        if not self.transaction_pooler or not self.database_url:
            return
        options = {
            "DATABASE_URL: its options": conninfo_to_dict(self.database_url).get("options"),
            "PGOPTIONS:": pgoptions.strip(),
        }
        for said, given in options.items():
            if given:
                raise ConfigError(
                    f"{said} cannot reach PostgreSQL through a transaction pooler "
                    "(DATABASE_POOLER=transaction: PgBouncer refuses or drops them); set them "
                    "on the login instead (ALTER ROLE … SET name = value) and unset them"
                )

    def _check_access(self) -> None:
        """The access variables, which only work together."""
        if self.auth_mode == "token" and not self.api_tokens:
            raise ConfigError("API_TOKENS: required when AUTH_MODE=token")
        lists = ("AUTH_OPERATOR_GROUPS", "AUTH_VIEWER_GROUPS", "AUTH_METRICS_GROUPS")
        given = [name for name in lists if name in self.explicit]  # given: not empty
        header = self.auth_groups_header
        if header and self.auth_mode != "header":
            raise ConfigError(
                f"AUTH_GROUPS_HEADER: only for AUTH_MODE=header (AUTH_MODE={self.auth_mode})"
            )
        if given and not header:
            raise ConfigError(
                f"{given[0]}: needs AUTH_GROUPS_HEADER, the header in which the "
                "authenticating proxy lists the caller's groups (e.g. X-Forwarded-Groups), "
                "and AUTH_MODE=header"
            )
        if header and not given:
            raise ConfigError(
                "AUTH_GROUPS_HEADER: set, but AUTH_OPERATOR_GROUPS, AUTH_VIEWER_GROUPS and "
                "AUTH_METRICS_GROUPS are all empty: every caller would be refused"
            )
        if header and header.lower() == self.auth_header.lower():
            raise ConfigError(
                f"AUTH_GROUPS_HEADER: the same header as AUTH_HEADER ({self.auth_header})"
            )

    def _check_bounds(self) -> None:
        """Variables bounded by others (the fields' descriptions say why)."""
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
        if self.liveness_stall_seconds <= 2 * self.db_pool_timeout_seconds:
            raise ConfigError(
                "LIVENESS_STALL_SECONDS: must be more than twice DATABASE_POOL_TIMEOUT_SECONDS "
                f"({2 * self.db_pool_timeout_seconds:g} s), got {self.liveness_stall_seconds:g}"
            )
        for name in ("TABULAR", "IMAGE"):
            low = getattr(self, f"{name.lower()}_min_in_flight")
            high = getattr(self, f"{name.lower()}_max_in_flight")
            if low > high:
                raise ConfigError(
                    f"{name}_MIN_IN_FLIGHT: must be at most {name}_MAX_IN_FLIGHT ({high}), "
                    f"got {low}"
                )

    def check_results_stream(self) -> None:
        """With RESULTS_STREAM set: the rules between its variables and the others'."""
        if not self.results_stream:
            return
        if not re.fullmatch(_JS_NAME, self.nats_queue_group):
            raise ConfigError(
                f"NATS_QUEUE_GROUP: names the durable consumer of RESULTS_STREAM, so only "
                f"A-Z a-z 0-9 _ - (1 to 64): {self.nats_queue_group!r}"
            )
        ack_wait, ack = self.results_stream_ack_wait_seconds, self.ack_timeout_seconds
        if ack_wait is not None and ack_wait > ack:
            raise ConfigError(
                f"RESULTS_STREAM_ACK_WAIT_SECONDS: must not exceed ACK_TIMEOUT_SECONDS "
                f"({ack:g}), got {ack_wait:g}: a service's ack held by "
                "a bridge that died would come back only after its request was sent again"
            )
        window, max_age = self.duplicate_window_seconds, self.results_stream_max_age_seconds
        if window > max_age:
            raise ConfigError(
                "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS: must not exceed "
                f"RESULTS_STREAM_MAX_AGE_SECONDS ({max_age:g})"
            )
        if window >= ack:
            given = self.results_stream_duplicate_window_seconds is not None
            raise ConfigError(
                f"RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS: must be shorter than "
                f"ACK_TIMEOUT_SECONDS ({ack:g}), got {window:g}"
                f"{'' if given else ' (not given: the server minimum of 0.1 s)'}: a service's "
                "ack to a republished request carries the first ack's Nats-Msg-Id, and the "
                "stream would drop it as a duplicate"
            )

    def pool_max_size(self) -> int:
        """The pool's max_size: DATABASE_POOL_MAX_SIZE, or by default the bridge's loops
        plus POOL_RESERVE; ConfigError when it leaves the API no connection."""
        # What the bridge's loops hold at once at most when this process runs them: one
        # per publisher and per inbox worker, one for the schedule runner.
        loops = self.outbox_publishers + self.inbox_workers + 1 if self.nats_enabled else 0
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
        """The SSL context of every NATS connection: when a NATS_TLS_* file is given or a
        URL is tls:// or wss://; None otherwise."""
        ca, cert, key = self.nats_tls_ca_file, self.nats_tls_cert_file, self.nats_tls_key_file
        secure = self.nats_tls_handshake_first or any(
            urlsplit(u).scheme in ("tls", "wss") for u in self.nats_urls
        )
        if not (ca or cert or key or secure):
            return None
        if ca:
            check_certificates("NATS_TLS_CA_FILE", ca)
        context = ssl.create_default_context(cafile=ca or None)  # empty: the system's CAs
        load_pair(context, "NATS_TLS_CERT_FILE", cert, "NATS_TLS_KEY_FILE", key)
        return context

    def https_context(self) -> ssl.SSLContext | None:
        """The server context of `serve` and the bridge's health port (HTTP_TLS_CERT_FILE,
        HTTP_TLS_KEY_FILE); None: plain HTTP."""
        cert, key = self.http_tls_cert_file, self.http_tls_key_file
        if not (cert or key):
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        load_pair(context, "HTTP_TLS_CERT_FILE", cert, "HTTP_TLS_KEY_FILE", key)
        return context

    def certificate_files(self) -> dict[str, str]:
        """Every certificate file this process reads, by the variable that names it (a
        database URL's as `DATABASE_URL sslcert`)."""
        files = {
            "NATS_TLS_CA_FILE": self.nats_tls_ca_file,
            "NATS_TLS_CERT_FILE": self.nats_tls_cert_file,
            "HTTP_TLS_CERT_FILE": self.http_tls_cert_file,
        }
        urls = {"DATABASE_URL": self.database_url, "DATABASE_LISTEN_URL": self.database_listen_url}
        for variable, url in urls.items():
            params = conninfo_to_dict(url) if url else {}
            for name in ("sslrootcert", "sslcert"):
                if params.get(name) != "system":  # libpq's "the system's CAs"
                    files[f"{variable} {name}"] = str(params.get(name) or "")
        return {var: path for var, path in files.items() if path}

    @property
    def duplicate_window_seconds(self) -> float:
        """RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS, or the default its description gives."""
        if self.results_stream_duplicate_window_seconds is not None:
            return self.results_stream_duplicate_window_seconds
        derived = min(self.ack_timeout_seconds / 3, 120.0, self.results_stream_max_age_seconds)
        return max(derived, 0.1)

    @property
    def stream_ack_wait_seconds(self) -> float:
        """RESULTS_STREAM_ACK_WAIT_SECONDS, or STREAM_ACK_WAIT_SECONDS."""
        given = self.results_stream_ack_wait_seconds
        return STREAM_ACK_WAIT_SECONDS if given is None else given

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """Every field, with passwords, tokens, the seed and the JWT as ***."""
        for name, value in super().__repr_args__():
            if name in ("database_url", "database_listen_url") and value:
                value = mask_url(value)
            elif name == "nats_urls":
                value = tuple(mask_url(u, bare_user_is_secret=True) for u in value)
            elif name in ("nats_seed", "nats_jwt"):
                value = "***" if value.get_secret_value() else ""
            elif name == "api_tokens":
                value = tuple(t._replace(token="***") for t in value)
            yield name, value

    def secrets(self) -> tuple[str, ...]:
        """Every secret value configured — passwords of DATABASE_URL and NATS_URL (as
        written and percent-decoded), a token in a NATS URL, the NATS seed and JWT, the
        API tokens — for arm_core.logs.Redactor to keep out of every line."""
        found: list[str] = []
        for url in filter(None, (self.database_url, self.database_listen_url)):
            found += url_secrets(url, bare_user_is_secret=False)
            with contextlib.suppress(psycopg.Error):
                params = conninfo_to_dict(url)
                found += [str(params[k]) for k in ("password", "sslpassword") if params.get(k)]
        for url in self.nats_urls:
            found += url_secrets(url, bare_user_is_secret=True)
        found += [s.get_secret_value() for s in (self.nats_seed, self.nats_jwt) if s]
        found += [t.token for t in self.api_tokens]
        return tuple(dict.fromkeys(found))

    def unlevelled_tokens(self) -> tuple[ApiToken, ...]:
        """API_TOKENS entries that name no level (each holds every level until 2.0)."""
        if self.auth_mode != "token":
            return ()
        return tuple(t for t in self.api_tokens if t.level is None)

    def require_safe_exposure(self) -> None:
        """`arm-core serve`: AUTH_MODE=none off loopback needs AUTH_ALLOW_ANONYMOUS=true."""
        if self.auth_mode != "none" or self.auth_allow_anonymous or is_loopback(self.http_host):
            return
        raise ConfigError(
            f"HTTP_HOST: {self.http_host!r} is not a loopback address and AUTH_MODE=none, "
            'so anyone who can reach it could retry files, audited as "anonymous". Set '
            "AUTH_MODE=token (with API_TOKENS) or AUTH_MODE=header (behind an "
            "authenticating proxy), listen on HTTP_HOST=127.0.0.1, or set "
            "AUTH_ALLOW_ANONYMOUS=true if anonymous access from the network is intended"
        )

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
        """The URL of the bridge's LISTEN session: DATABASE_LISTEN_URL, or DATABASE_URL
        but through a transaction pooler."""
        given = self.database_listen_url
        if given and not (self.transaction_pooler and given == self.database_url):
            return given
        if self.transaction_pooler:
            raise ConfigError(
                "DATABASE_LISTEN_URL: required with DATABASE_POOLER=transaction, and not "
                "DATABASE_URL: the bridge's LISTEN needs a session of its own, direct to "
                "PostgreSQL; through a transaction pooler it would hear no NOTIFY"
            )
        return self.require_database_url()

    def require_session_url(self, command: str) -> str:
        """DATABASE_URL for `command` (`migrate`, `rollback`), which holds an advisory
        lock across transactions: refused through a transaction pooler."""
        url = self.require_database_url()
        if self.transaction_pooler:
            raise ConfigError(
                f"DATABASE_POOLER: is transaction, and `arm-core {command}` needs a session "
                "of its own for its whole run (it holds an advisory lock across "
                "transactions): run it with DATABASE_URL direct to PostgreSQL (the address "
                "DATABASE_LISTEN_URL names) and DATABASE_POOLER unset"
            )
        return url


# The results stream consumer's ack_wait when RESULTS_STREAM_ACK_WAIT_SECONDS is not
# given: long enough for a full inbox buffer to be applied (an answer waiting on its
# job's publish is kept with in_progress), short enough that a crashed bridge's share
# comes back soon.
STREAM_ACK_WAIT_SECONDS = 30.0


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable from this machine only: localhost,
    127.0.0.0/8, ::1. An empty host (every interface) or any other name is not."""
    value = host.strip().strip("[]").lower()
    try:
        return value == "localhost" or ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False
