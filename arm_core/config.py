"""Configuration from the environment (SPEC §12).

Every variable is parsed once at start. A bad value raises :class:`ConfigError` whose
message names the variable, so a misconfigured container fails at once and says why.

This is the one environment parser: a dataclass declares each variable with
:func:`env_var` (its name, a parser, its default) and :func:`read_env` reads them all.
:class:`Settings` is one such dataclass; the dev tools' ``REFERENCE_*`` configuration
(arm_core.devtools.reference) is another, with the same parsers (:func:`parse_bool`,
:func:`number`, :func:`one_of`, :func:`text`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

N = TypeVar("N", int, float)

# A parser takes the variable's name and its raw value; it returns the value or raises
# ConfigError naming the variable (never quoting a secret's value).
Parser = Callable[[str, str], Any]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A configuration variable is missing or has a value that cannot be used."""


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}: expected true or false, got {raw!r}")


def number(kind: Callable[[str], N], minimum: float | None = None) -> Callable[[str, str], N]:
    """An int or float parser; nan and inf are not numbers here."""

    def parse(name: str, raw: str) -> N:
        try:
            value = kind(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}: expected a number, got {raw!r}") from None
        if not math.isfinite(value):
            raise ConfigError(f"{name}: expected a number, got {raw!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(f"{name}: must be at least {minimum}, got {raw!r}")
        return value

    return parse


def one_of(
    options: tuple[str, ...], fold: Callable[[str], str] = str.lower
) -> Callable[[str, str], str]:
    """One of `options`, compared after stripping and `fold` (lower-case by default)."""

    def parse(name: str, raw: str) -> str:
        value = fold(raw.strip())
        if value not in options:
            raise ConfigError(f"{name}: expected one of {', '.join(options)}, got {raw!r}")
        return value

    return parse


def text(name: str, raw: str) -> str:
    """Any text, stripped; the one parser for which an empty value counts as given."""
    return raw.strip()


def env_var(env: str, parse: Parser, default: Any) -> Any:
    """A dataclass field read from the environment variable `env` by :func:`read_env`."""
    return field(default=default, metadata={"env": env, "parse": parse})


def read_env(cls: type, env: Mapping[str, str]) -> tuple[dict[str, Any], frozenset[str]]:
    """The :func:`env_var` fields of dataclass `cls` that `env` gives, parsed (by field
    name), and the names of the variables given. A blank value counts as not given,
    except for :func:`text`. Raises ConfigError naming the first bad variable."""
    values: dict[str, Any] = {}
    given: set[str] = set()
    for f in dataclasses.fields(cls):
        name = f.metadata.get("env")
        if name is None:
            continue
        raw = env.get(name)
        if raw is None or (raw.strip() == "" and f.metadata["parse"] is not text):
            continue
        values[f.name] = f.metadata["parse"](name, raw)
        given.add(name)
    return values, frozenset(given)


def _port(name: str, raw: str) -> int:
    value = number(int, 0)(name, raw)
    if value > 65535:
        raise ConfigError(f"{name}: not a TCP port: {raw!r}")
    return value


def _database_url(name: str, raw: str) -> str:
    value = raw.strip()
    scheme = urlsplit(value).scheme
    if scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"{name}: expected a postgresql://… connection string, got {raw!r}")
    return value


def _nats_urls(name: str, raw: str) -> tuple[str, ...]:
    urls = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not urls:
        raise ConfigError(f"{name}: expected one or more nats://host:port URLs, got {raw!r}")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
            raise ConfigError(f"{name}: not a NATS URL: {url!r}")
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise ConfigError(f"{name}: bad port in {url!r}") from None
    return urls


def _subject(name: str, raw: str) -> str:
    value = raw.strip()
    if not value or any(c.isspace() for c in value) or value.startswith(".") or ".." in value:
        raise ConfigError(f"{name}: not a NATS subject: {raw!r}")
    return value


AUTH_MODES = ("none", "token", "header")


def _tokens(name: str, raw: str) -> tuple[tuple[str, str], ...]:
    """`actor=token,actor2=token2` → ((actor, token), …)."""
    pairs = []
    for part in raw.split(","):
        if not part.strip():
            continue
        actor, sep, token = part.strip().partition("=")
        if not sep or not actor.strip() or len(token.strip()) < 16:
            raise ConfigError(
                f"{name}: expected actor=token pairs, comma-separated, tokens of 16+ "
                f"characters; got an entry starting {part.strip()[:12]!r}"
            )
        pairs.append((actor.strip(), token.strip()))
    return tuple(pairs)


def _header(name: str, raw: str) -> str:
    value = raw.strip()
    if not value or not all(c.isalnum() or c == "-" for c in value):
        raise ConfigError(f"{name}: not an HTTP header name: {raw!r}")
    return value


_POSITIVE = number(float, 0.001)


@dataclass(frozen=True)
class Settings:
    """Everything the processes read from the environment, with SPEC §12's defaults."""

    database_url: str | None = env_var("DATABASE_URL", _database_url, None)
    db_pool_timeout_seconds: float = env_var("DATABASE_POOL_TIMEOUT_SECONDS", _POSITIVE, 5.0)
    nats_urls: tuple[str, ...] = env_var("NATS_URL", _nats_urls, ("nats://127.0.0.1:4222",))
    nats_enabled: bool = env_var("NATS_ENABLED", parse_bool, True)
    debug: bool = env_var("DEBUG", parse_bool, False)
    nats_seed: str = env_var("OPENBAO__NATS__NATS_SEED", text, "")
    nats_jwt: str = env_var("OPENBAO__NATS__NATS_JWT", text, "")
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
    http_port: int = env_var("HTTP_PORT", _port, 8080)
    bridge_health_port: int = env_var("BRIDGE_HEALTH_PORT", _port, 8081)
    tabular_request_subject: str = env_var(
        "TABULAR_REQUEST_SUBJECT", _subject, "files.tabular_uploaded"
    )
    image_request_subject: str = env_var("IMAGE_REQUEST_SUBJECT", _subject, "files.img_uploaded")
    result_subject: str = env_var("RESULT_SUBJECT", _subject, "files.tabular_parsed")
    nats_queue_group: str = env_var("NATS_QUEUE_GROUP", _subject, "arm-core")
    inbox_max_payload_bytes: int = env_var("INBOX_MAX_PAYLOAD_BYTES", number(int, 1024), 1 << 20)
    inbox_buffer_size: int = env_var("INBOX_BUFFER_SIZE", number(int, 1), 10_000)
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
    api_tokens: tuple[tuple[str, str], ...] = env_var("API_TOKENS", _tokens, ())
    auth_header: str = env_var("AUTH_HEADER", _header, "X-Forwarded-User")
    # Names of the variables that were given explicitly (not defaulted).
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Reads every variable; raises ConfigError naming the first bad one."""
        values, given = read_env(cls, os.environ if environ is None else environ)
        settings = cls(**values, explicit=given)
        if settings.auth_mode == "token" and not settings.api_tokens:
            raise ConfigError("API_TOKENS: required when AUTH_MODE=token")
        return settings

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigError("DATABASE_URL: required (postgresql://user@host:port/dbname)")
        return self.database_url

    def subject_for(self, pipeline: str) -> str:
        """The request subject of a pipeline: tabular → files.tabular_uploaded, image → …"""
        if pipeline == "tabular":
            return self.tabular_request_subject
        if pipeline == "image":
            return self.image_request_subject
        raise ValueError(f"unknown pipeline {pipeline!r}")
