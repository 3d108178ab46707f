"""Where the processes of :class:`arm_core.config.Settings` connect and listen, and with
which TLS files: DATABASE_URL and DATABASE_LISTEN_URL (as libpq reads them), what
DATABASE_URL goes through (DATABASE_POOLER), NATS_URL, the NATS subjects, the listen
ports, and the TLS file paths, read and checked by arm_core.tls.

A URL in a message is masked by arm_core.redaction: its password or NATS token is ***.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from arm_core.config_env import number
from arm_core.config_error import ConfigError
from arm_core.redaction import mask_url, mask_urls_in, url_secrets
from arm_core.tls import nats_client_context

if TYPE_CHECKING:
    from arm_core.config import Settings


def parse_port(name: str, raw: str) -> int:
    value = number(int, 0)(name, raw)
    if value > 65535:
        raise ConfigError(f"{name}: not a TCP port: {raw!r}")
    return value


def parse_database_url(name: str, raw: str) -> str:
    """A libpq connection string: a postgresql:// URL (several hosts allowed, as
    host1:5432,host2:5432 with target_session_attrs=read-write) or the key=value form
    (host=a,b port=5432,5432 dbname=arm …)."""
    value = raw.strip()
    scheme, sep, _ = value.partition("://")
    is_url, is_keywords = bool(sep), not sep and "=" in value
    if (is_url and scheme not in ("postgresql", "postgres")) or not (is_url or is_keywords):
        raise ConfigError(
            f"{name}: expected a postgresql://… URL or libpq's key=value form, "
            f"got {mask_url(value)!r}"
        )
    try:  # libpq's own parser: a string it cannot read fails here, not at the first query
        conninfo_to_dict(value)
    except psycopg.Error as exc:
        # libpq quotes the part it could not read, which may be the password.
        said = str(exc).strip()
        for secret in url_secrets(value, bare_user_is_secret=False):
            said = said.replace(secret, "***")
        raise ConfigError(
            f"{name}: not a valid connection string ({mask_url(value)!r}): {mask_urls_in(said)}"
        ) from None
    return value


# What DATABASE_URL goes through (DATABASE_POOLER): PostgreSQL itself — or a pooler that
# keeps a client's server session while it stays connected (PgBouncer's pool_mode =
# session), which is the same to arm-core — or one that gives a client a server session
# per transaction (pool_mode = transaction). Said, not detected: PgBouncer does not tell
# a client it is there (a regular connection's SHOW pool_mode reaches PostgreSQL, which
# knows no such setting; only its admin console answers, to its admin users), other
# poolers answer differently again, and one client seeing the same backend twice proves
# nothing.
POOLERS = ("none", "transaction")


def parse_pooler(name: str, raw: str) -> str:
    """One of POOLERS. A statement pooler is refused by name (the publisher holds a
    transaction across statements while NATS confirms the batch), and so is `session`,
    which needs nothing: arm-core treats it as PostgreSQL itself."""
    value = raw.strip().lower()
    if value == "statement":
        raise ConfigError(
            f"{name}: statement pooling cannot work: the bridge's transactions span several "
            "statements (the publisher's claim, NATS's confirmation, the commit); use "
            "pool_mode = transaction"
        )
    if value == "session":
        raise ConfigError(
            f"{name}: a session pooler is the same to arm-core as PostgreSQL itself: leave "
            f"{name} unset (none); see docs/dbas.md#through-pgbouncer for its startup options"
        )
    if value not in POOLERS:
        raise ConfigError(f"{name}: expected one of {', '.join(POOLERS)}, got {raw!r}")
    return value


def check_pooler(settings: Settings, pgoptions: str) -> None:
    """Through a transaction pooler no startup option reaches PostgreSQL (PgBouncer 1.18
    refuses a connection that sends `options` unless ignore_startup_parameters lists it,
    and then drops it): DATABASE_URL's `options`, or PGOPTIONS (`pgoptions`, which libpq
    sends when the URL has none), would be lost, so they stop the process at start."""
    if settings.database_pooler != "transaction" or not settings.database_url:
        return
    if conninfo_to_dict(settings.database_url).get("options"):
        raise ConfigError(
            "DATABASE_URL: its options cannot reach PostgreSQL through a transaction pooler "
            "(DATABASE_POOLER=transaction: PgBouncer refuses or drops them); set them on "
            "the login instead (ALTER ROLE … SET name = value) and take them out of the URL"
        )
    if pgoptions.strip():
        raise ConfigError(
            "PGOPTIONS: cannot reach PostgreSQL through a transaction pooler "
            "(DATABASE_POOLER=transaction: PgBouncer refuses or drops them); set them on "
            "the login instead (ALTER ROLE … SET name = value) and unset PGOPTIONS"
        )


def listen_url(settings: Settings) -> str:
    """The URL of the bridge's LISTEN session: DATABASE_LISTEN_URL, or DATABASE_URL.
    Through a transaction pooler a LISTEN lasts one transaction and its session then
    serves another client, so DATABASE_LISTEN_URL is required there (ConfigError, exit 2
    at the start of `serve` and `bridge`)."""
    given = settings.database_listen_url
    if given and not (settings.transaction_pooler and given == settings.database_url):
        return given
    if settings.transaction_pooler:
        raise ConfigError(
            "DATABASE_LISTEN_URL: required with DATABASE_POOLER=transaction, and not "
            "DATABASE_URL: the bridge's LISTEN needs a session of its own, direct to "
            "PostgreSQL; through a transaction pooler it would hear no NOTIFY"
        )
    return settings.require_database_url()


def session_url(settings: Settings, command: str) -> str:
    """DATABASE_URL for `command` (`migrate`, `rollback`), which holds an advisory lock
    across transactions for its whole run; refused with DATABASE_POOLER=transaction
    (ConfigError, exit 2): the lock would stay on whichever server session took it."""
    url = settings.require_database_url()
    if settings.transaction_pooler:
        raise ConfigError(
            f"DATABASE_POOLER: is transaction, and `arm-core {command}` needs a session of "
            "its own for its whole run (it holds an advisory lock across transactions): run "
            "it with DATABASE_URL direct to PostgreSQL (the address DATABASE_LISTEN_URL "
            "names) and DATABASE_POOLER unset"
        )
    return url


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def parse_nats_urls(name: str, raw: str) -> tuple[str, ...]:
    urls = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not urls:
        raise ConfigError(f"{name}: expected one or more nats://host:port URLs")
    for url in urls:
        shown = mask_url(url, bare_user_is_secret=True)
        try:
            parts = urlsplit(url)
            if parts.scheme not in NATS_SCHEMES or not parts.hostname:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"{name}: not a NATS URL ({'|'.join(NATS_SCHEMES)}://host:port): {shown!r}"
            ) from None
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise ConfigError(f"{name}: bad port in {shown!r}") from None
    websocket = {urlsplit(url).scheme in ("ws", "wss") for url in urls}
    if len(websocket) > 1:  # nats-py refuses the mix at every connect
        raise ConfigError(f"{name}: websocket (ws, wss) and nats/tls URLs cannot be mixed")
    return urls


def parse_subject(name: str, raw: str) -> str:
    value = raw.strip()
    if not value or any(c.isspace() for c in value) or value.startswith(".") or ".." in value:
        raise ConfigError(f"{name}: not a NATS subject: {raw!r}")
    return value


def parse_path(name: str, raw: str) -> str:
    """A file's path, as given (read and checked by arm_core.tls at start)."""
    return raw.strip()


def nats_tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The SSL context of every NATS connection (bridge/nats_client.connect): when a
    NATS_TLS_* file is given or a URL is tls:// or wss://; None otherwise. Raises
    ConfigError naming the variable of a file that cannot work."""
    files = (settings.nats_tls_ca_file, settings.nats_tls_cert_file, settings.nats_tls_key_file)
    secure = settings.nats_tls_handshake_first or any(
        urlsplit(u).scheme in ("tls", "wss") for u in settings.nats_urls
    )
    if not (any(files) or secure):
        return None
    return nats_client_context(*files)


def certificate_files(settings: Settings) -> dict[str, str]:
    """Every certificate file this process reads, by the variable that names it:
    NATS_TLS_CA_FILE, NATS_TLS_CERT_FILE, HTTP_TLS_CERT_FILE, and the sslrootcert and
    sslcert of DATABASE_URL and DATABASE_LISTEN_URL (as `DATABASE_URL sslcert`)."""
    files = {
        "NATS_TLS_CA_FILE": settings.nats_tls_ca_file,
        "NATS_TLS_CERT_FILE": settings.nats_tls_cert_file,
        "HTTP_TLS_CERT_FILE": settings.http_tls_cert_file,
    }
    urls = {
        "DATABASE_URL": settings.database_url,
        "DATABASE_LISTEN_URL": settings.database_listen_url,
    }
    for variable, url in urls.items():
        params = conninfo_to_dict(url) if url else {}
        for name in ("sslrootcert", "sslcert"):
            value = str(params.get(name) or "")
            if value and value != "system":  # libpq's "the system's CAs"
                files[f"{variable} {name}"] = value
    return {var: path for var, path in files.items() if path}
