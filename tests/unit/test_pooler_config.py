"""DATABASE_LISTEN_URL and DATABASE_POOLER (docs/dbas.md#through-pgbouncer): the LISTEN
session's own URL, checked like DATABASE_URL; and what a transaction pooler in front of
DATABASE_URL changes — the pool prepares no statement and sends no startup option,
LISTEN must have a URL of its own, migrate and rollback refuse — each a start-up error
(exit 2) naming its variable and quoting no password."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from arm_core.config import Settings
from arm_core.config_error import ConfigError
from arm_core.devtools.testbed.pgbouncer import DOCUMENTED_INI, MACHINE_KEYS, documented_settings
from arm_core.runtime import make_pool
from tests.unit.test_config import error_of, no_part_of

POOL = "postgresql://arm_bridge_login:Pw9xQ2vL7k@pgbouncer:6432/arm"
DIRECT = "postgresql://arm_bridge_login:Dk4mR8wZ2q@db:5432/arm"
TRANSACTION = {"DATABASE_URL": POOL, "DATABASE_POOLER": "transaction"}


def test_the_listen_url_is_the_database_url_unless_given() -> None:
    assert Settings.from_env({"DATABASE_URL": POOL}).listen_url() == POOL
    both = Settings.from_env({"DATABASE_URL": POOL, "DATABASE_LISTEN_URL": DIRECT})
    assert both.listen_url() == DIRECT and both.require_database_url() == POOL
    assert Settings.from_env({}).database_pooler == "none"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("mysql://admin:Pw9xQ2vL7k@db/arm", "mysql://admin:***@db/arm"),
        ("postgresql://admin:Pw9x Q2vL7k@db/arm", 'spaces found in "***"'),
        ("host=db user=admin password=Pw9xQ2vL7k oops", "password=***"),
    ],
)
def test_a_bad_listen_url_fails_naming_it_and_not_its_password(value: str, shown: str) -> None:
    message = error_of({"DATABASE_URL": POOL, "DATABASE_LISTEN_URL": value})
    assert message.startswith("DATABASE_LISTEN_URL: ") and shown in message, message
    assert no_part_of("Pw9xQ2vL7k", message), message


def test_the_listen_urls_password_is_a_secret_and_masked() -> None:
    s = Settings.from_env({"DATABASE_URL": POOL, "DATABASE_LISTEN_URL": DIRECT})
    assert {"Pw9xQ2vL7k", "Dk4mR8wZ2q"} <= set(s.secrets())
    shown = repr(s)
    assert "postgresql://arm_bridge_login:***@db:5432/arm" in shown, shown
    assert no_part_of("Dk4mR8wZ2q", shown) and no_part_of("Pw9xQ2vL7k", shown), shown


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("statement", "statement pooling cannot work"),
        ("session", "the same to arm-core as PostgreSQL itself: leave DATABASE_POOLER unset"),
        ("yes", "expected one of none, transaction"),
    ],
)
def test_a_pooler_arm_core_cannot_work_through_fails_at_start(value: str, said: str) -> None:
    message = error_of({"DATABASE_POOLER": value})
    assert message.startswith("DATABASE_POOLER: ") and said in message, message


def test_none_is_direct() -> None:
    s = Settings.from_env({"DATABASE_URL": POOL, "DATABASE_POOLER": " None"})
    assert s.database_pooler == "none" and not s.transaction_pooler
    assert s.listen_url() == POOL and s.require_session_url("migrate") == POOL


def test_through_a_transaction_pooler_listen_needs_its_own_url() -> None:
    s = Settings.from_env(TRANSACTION)
    with pytest.raises(ConfigError, match=r"^DATABASE_LISTEN_URL: required with DATABASE_POOLER"):
        s.listen_url()
    given = Settings.from_env({**TRANSACTION, "DATABASE_LISTEN_URL": DIRECT})
    assert given.listen_url() == DIRECT
    same = Settings.from_env({**TRANSACTION, "DATABASE_LISTEN_URL": POOL})
    with pytest.raises(ConfigError, match=r"^DATABASE_LISTEN_URL: required .*, and not DATA"):
        same.listen_url()


@pytest.mark.parametrize("command", ["migrate", "rollback"])
def test_through_a_transaction_pooler_migrate_and_rollback_refuse(command: str) -> None:
    s = Settings.from_env({**TRANSACTION, "DATABASE_LISTEN_URL": DIRECT})
    with pytest.raises(ConfigError, match=r"^DATABASE_POOLER: is transaction") as caught:
        s.require_session_url(command)
    assert f"`arm-core {command}` needs a session of its own" in str(caught.value)


def test_through_a_transaction_pooler_startup_options_are_refused() -> None:
    """PgBouncer refuses a connection that sends `options` (or drops them when told to
    ignore them): the URL's and PGOPTIONS would never reach PostgreSQL."""
    url = f"{POOL}?options=-c%20statement_timeout%3D5s"
    message = error_of({**TRANSACTION, "DATABASE_URL": url})
    assert message.startswith("DATABASE_URL: its options cannot reach PostgreSQL"), message
    assert "ALTER ROLE" in message and no_part_of("Pw9xQ2vL7k", message)
    message = error_of({**TRANSACTION, "PGOPTIONS": "-c statement_timeout=5s"})
    assert message.startswith("PGOPTIONS: cannot reach PostgreSQL"), message
    # Direct they go as before.
    assert Settings.from_env({"DATABASE_URL": url}).database_url == url
    Settings.from_env({"DATABASE_URL": POOL, "PGOPTIONS": "-c statement_timeout=5s"})


def test_through_a_transaction_pooler_the_pool_prepares_nothing_and_sends_no_options() -> None:
    """psycopg prepares a statement on its fifth run by default, on whichever server
    session the pooler gave that transaction (tests/e2e/test_pgbouncer.py shows the
    error a real PgBouncer gives); and arm-core's idle-in-transaction timeout would be a
    startup option PgBouncer refuses."""
    direct = kwargs_of(Settings.from_env({"DATABASE_URL": POOL, "NATS_ENABLED": "false"}))
    assert "prepare_threshold" not in direct
    assert "idle_in_transaction_session_timeout=20000" in direct["options"]
    pooled = kwargs_of(Settings.from_env({**TRANSACTION, "NATS_ENABLED": "false"}))
    assert pooled["prepare_threshold"] is None and "options" not in pooled
    assert pooled["keepalives"] == "1" and pooled["autocommit"] is True


def kwargs_of(settings: Settings) -> dict[str, Any]:
    """What the process's pool passes to every connection it opens."""
    kwargs = make_pool(settings).kwargs
    assert isinstance(kwargs, dict)
    return kwargs


def arm_core(command: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "OUTBOX_", "DATA"))}
    path = str(Path(sys.executable).with_name("arm-core"))
    return subprocess.run(
        [path, command], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("command", "env", "said"),
    [
        ("serve", {}, "DATABASE_LISTEN_URL: required with DATABASE_POOLER=transaction"),
        ("bridge", {}, "DATABASE_LISTEN_URL: required with DATABASE_POOLER=transaction"),
        ("migrate", {"DATABASE_LISTEN_URL": DIRECT}, "DATABASE_POOLER: is transaction"),
    ],
)
def test_arm_core_exits_2_naming_what_the_pooler_needs(
    command: str, env: dict[str, str], said: str
) -> None:
    done = arm_core(command, **TRANSACTION, **env)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and no_part_of("Pw9xQ2vL7k", done.stderr), done.stderr


def test_the_dbas_page_quotes_the_pgbouncer_ini_the_test_runs() -> None:
    """docs/pgbouncer.ini is the one copy: docs/dbas.md quotes it whole, and
    tests/e2e/test_pgbouncer.py runs it with only the keys under `; where` replaced."""
    ini = DOCUMENTED_INI.read_text(encoding="utf-8")
    page = (DOCUMENTED_INI.parent / "dbas.md").read_text(encoding="utf-8")
    assert f"```ini\n{ini}```" in page, "docs/dbas.md must quote docs/pgbouncer.ini"
    where = ini.split("; where\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert tuple(line.split(" = ")[0] for line in where) == MACHINE_KEYS
    settings = documented_settings()
    assert settings["pool_mode"] == "transaction"
    assert "ignore_startup_parameters" not in settings  # arm-core sends none
