"""What `arm-core` prints, run as users run it:

- a configuration that cannot work stops `serve`, `bridge` and `migrate` at start with
  exit code 2 and a message naming the variable — a bad NATS seed or JWT included,
  which used to leave a bridge "connecting" forever;
- no secret (a password in DATABASE_URL or NATS_URL, a token in NATS_URL, an API token,
  the NATS seed or JWT) appears in stdout, stderr or the log on any of those paths, nor
  when the database or NATS cannot be reached, nor when libpq quotes the secret in its
  own message, nor when the HTTP port is taken;
- `serve` refuses AUTH_MODE=none on a non-loopback HTTP_HOST unless
  AUTH_ALLOW_ANONYMOUS=true; the bridge, whose port serves only its health, does not;
- a job_id that forges a log line, read from an envelope that failed the schema, stays
  on the one line that logs the drop.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import uuid
from pathlib import Path

import nkeys
import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ARM_CORE, ArmProcess, Stack
from arm_core.devtools.testbed.services import envelope, nats_client, send
from tests.support.natsauth import operator_mode

pytestmark = pytest.mark.e2e

DB_PASSWORD = "Db-S3cret%2F9xQ2"  # percent-encoded: "Db-S3cret/9xQ2" is the password
NATS_PASSWORD = "Nats-S3cret-7kL4"
NATS_TOKEN = "NatsTok-S3cret-5mP8"
API_TOKEN = "Api-S3cret-0123456789"
SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()
OTHER = operator_mode()  # a well-formed JWT, issued to another key than SEED's
# Everything above, as written and as decoded.
SECRETS = (DB_PASSWORD, "Db-S3cret/9xQ2", NATS_PASSWORD, NATS_TOKEN, API_TOKEN, SEED)


def shows_none(text: str, secrets: tuple[str, ...] = SECRETS, width: int = 8) -> bool:
    """Whether `text` holds no run of `width` characters of any secret (so "S3cret" in
    "Db-S3cret" would not do either, nor any other part of a seed or token)."""
    return not any(s[i : i + width] in text for s in secrets for i in range(len(s) - width + 1))


def with_password(db_url: str, password: str = DB_PASSWORD) -> str:
    """The test database's URL with a password (the embedded server trusts loopback)."""
    return re.sub(r"^postgresql://([^@/]+)@", rf"postgresql://\1:{password}@", db_url)


def run(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`arm-core command` in a clean environment; the timeout is a deadline on a hang
    (a bridge that starts instead of refusing), not a timed assertion."""
    return subprocess.run(
        [ARM_CORE, command],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def background(db_url: str, nats_url: str) -> dict[str, str]:
    """A working environment holding every kind of secret, for a case to spoil one of."""
    return {
        "DATABASE_URL": with_password(db_url),
        "NATS_URL": nats_url.replace("nats://", f"nats://arm:{NATS_PASSWORD}@"),
        "OPENBAO__NATS__NATS_SEED": SEED,
        "AUTH_MODE": "token",
        "API_TOKENS": f"ops={API_TOKEN}",
        "HTTP_PORT": str(free_port()),
        "BRIDGE_HEALTH_PORT": str(free_port()),
    }


SEED_ERROR = "OPENBAO__NATS__NATS_SEED: not a valid nkey seed"
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
TYPO = SEED[:30] + ALPHABET[(ALPHABET.index(SEED[30]) + 1) % 32] + SEED[31:]
ACCOUNT_SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT).decode()
BAD_JWT = "eyJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJzdWIiOiJVQUJDIn0.c2lnbmF0dXJl+"  # not base64url
# The secrets the cases below put in the spoiled variable.
SPOILED = ("Db-S3cret 9xQ2", "Api-S3cret-0", TYPO, ACCOUNT_SEED, BAD_JWT, OTHER.user_jwt)

# (commands, variable, value, what the message says after "configuration error: ")
CASES = [
    (
        ("migrate", "serve", "bridge"),
        "DATABASE_URL",
        f"mysql://admin:{DB_PASSWORD}@db.example/arm",
        "DATABASE_URL: expected a postgresql://… URL or libpq's key=value form, got "
        "'mysql://admin:***@db.example/arm'",
    ),
    (
        ("migrate", "serve", "bridge"),
        "DATABASE_URL",
        "postgresql://admin:Db-S3cret 9xQ2@127.0.0.1/arm",
        "DATABASE_URL: not a valid connection string ('postgresql://admin:***@127.0.0.1/arm'): "
        'unexpected spaces found in "***"',
    ),
    (
        ("serve", "bridge"),
        "NATS_URL",
        f"http://arm:{NATS_PASSWORD}@127.0.0.1:4222",
        "NATS_URL: not a NATS URL (nats|tls|ws|wss://host:port): 'http://arm:***@127.0.0.1:4222'",
    ),
    (
        ("serve", "bridge"),
        "NATS_URL",
        f"nats://{NATS_TOKEN}@127.0.0.1:99999",
        "NATS_URL: bad port in 'nats://***@127.0.0.1:99999'",
    ),
    (("serve",), "API_TOKENS", "ivanova=Api-S3cret-0", "API_TOKENS: entry 1 of 1: the token"),
    (("serve",), "API_TOKENS", f"ops={API_TOKEN},{API_TOKEN}", "API_TOKENS: entry 2 of 2"),
    (
        ("serve",),
        "API_TOKENS",
        f"ops:admin={API_TOKEN}",
        "API_TOKENS: entry 1 of 1: the access level after ':' is not one of viewer",
    ),
    (
        ("serve",),
        "API_TOKENS",
        f"ops:viewer={API_TOKEN},ops:operator={API_TOKEN}",
        "API_TOKENS: entry 2 of 2: the same token as entry 1, with another level",
    ),
    (
        ("serve",),
        "AUTH_OPERATOR_GROUPS",
        "arm-operators",
        "AUTH_OPERATOR_GROUPS: needs AUTH_GROUPS_HEADER",
    ),
    # the seed: SUAM… of the wrong length
    (("serve", "bridge"), "OPENBAO__NATS__NATS_SEED", "SUAMXXXXXXXXXXXXXXXXXXXXXX", SEED_ERROR),
    (("bridge",), "OPENBAO__NATS__NATS_SEED", TYPO, f"{SEED_ERROR} (its checksum does not match"),
    (
        ("bridge",),
        "OPENBAO__NATS__NATS_SEED",
        ACCOUNT_SEED,
        f"{SEED_ERROR} (an account seed",
    ),
    (("serve", "bridge"), "OPENBAO__NATS__NATS_JWT", BAD_JWT, "OPENBAO__NATS__NATS_JWT: not a JWT"),
    (
        ("bridge",),
        "OPENBAO__NATS__NATS_JWT",
        OTHER.user_jwt,
        "OPENBAO__NATS__NATS_JWT: issued to another user",
    ),
]


@pytest.mark.parametrize(
    ("command", "variable", "value", "said"),
    [(cmd, *case[1:]) for case in CASES for cmd in case[0]],
    # Named by command, variable and what is said; not by the (random, secret) value.
    ids=[f"{cmd}-{case[1]}-{case[3]}" for case in CASES for cmd in case[0]],
)
def test_a_bad_variable_stops_at_start_naming_it_and_showing_no_secret(
    db_url: str, nats_server: EmbeddedNats, command: str, variable: str, value: str, said: str
) -> None:
    # Everything else works: without the start-up check serve and bridge would run (and
    # the deadline in run() would fail the test).
    env = {**background(db_url, nats_server.url()), variable: value}
    done = run(command, env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"arm-core: configuration error: {said}"), done.stderr
    assert shows_none(done.stdout + done.stderr, SECRETS + SPOILED)


def test_migrate_without_a_database_shows_no_password() -> None:
    url = f"postgresql://admin:{DB_PASSWORD}@127.0.0.1:{free_port()}/arm"
    done = run("migrate", {"DATABASE_URL": url})
    assert done.returncode == 1, done.stderr
    assert "migrate: database unavailable: connection failed" in done.stderr
    assert shows_none(done.stdout + done.stderr)


def test_a_driver_message_quoting_the_password_is_redacted(db_url: str) -> None:
    # libpq quotes an option's value it cannot use; here that value is the password, as
    # a connection string that went wrong might have it.
    url = with_password(db_url, "Db-S3cret-9xQ2") + "?sslmode=Db-S3cret-9xQ2"
    done = run("migrate", {"DATABASE_URL": url})
    assert done.returncode == 1, done.stderr
    assert 'invalid sslmode value: "***"' in done.stderr
    assert shows_none(done.stdout + done.stderr, ("Db-S3cret-9xQ2",))


def wait_for_log(proc: ArmProcess, *needles: str, within: float = 30) -> str:
    proc.wait_until(lambda: all(n in proc.log() for n in needles), within, f"{needles} logged")
    return proc.log()


@pytest.mark.parametrize("command", ["serve", "bridge"])
def test_unreachable_database_and_nats_show_no_secret(command: str, tmp_path: Path) -> None:
    env = {
        **background(
            f"postgresql://admin@127.0.0.1:{free_port()}/arm", f"nats://127.0.0.1:{free_port()}"
        ),
        "DEBUG": "true",
    }
    proc = ArmProcess(command, env, tmp_path / f"{command}.log")
    try:
        port = int(env["HTTP_PORT" if command == "serve" else "BRIDGE_HEALTH_PORT"])
        # the pool's and nats-py's errors, each at least once
        text = wait_for_log(proc, "error connecting in 'arm-core'", "NATS error")
        assert proc.health(port) is None  # 503: the database is down
    finally:
        assert proc.stop() == 0
    assert shows_none(proc.log()), text


async def test_a_running_stack_with_every_secret_set_shows_none(stack: Stack) -> None:
    env = background(stack.db_url, stack.nats.url())
    env["DEBUG"] = "true"
    serve, _ = stack.serve(**{k: v for k, v in env.items() if k != "HTTP_PORT"})
    bridge = stack.bridge(**{k: v for k, v in env.items() if k != "BRIDGE_HEALTH_PORT"})
    # A password shorter than the log's Redactor.MIN_LENGTH is masked where it is logged.
    short = stack.bridge(NATS_URL=stack.nats.url().replace("nats://", "nats://arm:Pw9k@"))
    for proc in (serve, bridge, short):
        assert proc.stop() == 0
        assert "connected to NATS arm:***@127.0.0.1:" in proc.log(), proc.log()
        assert shows_none(proc.log()) and "Pw9k" not in proc.log(), proc.log()


def test_a_taken_http_port_is_logged_without_a_secret(
    db_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    env = background(db_url, nats_server.url())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(env["HTTP_PORT"])))
        taken.listen()
        done = run("serve", env)
    assert done.returncode != 0
    assert "address already in use" in done.stderr, done.stderr
    assert shows_none(done.stdout + done.stderr)


# --- safe by default on the network (part 3) ------------------------------------------


def test_serve_refuses_anonymous_access_from_the_network(db_url: str) -> None:
    env = {"DATABASE_URL": db_url, "NATS_ENABLED": "false", "HTTP_HOST": "0.0.0.0"}
    done = run("serve", env)
    assert done.returncode == 2
    assert done.stderr.startswith("arm-core: configuration error: HTTP_HOST: '0.0.0.0' is not")
    assert "AUTH_MODE=none" in done.stderr and "AUTH_ALLOW_ANONYMOUS=true" in done.stderr


def test_anonymous_access_from_the_network_when_asked_for(stack: Stack) -> None:
    serve, _ = stack.serve(HTTP_HOST="0.0.0.0", AUTH_ALLOW_ANONYMOUS="true")
    assert "AUTH_ALLOW_ANONYMOUS=true: anyone who can reach 0.0.0.0:" in serve.log()
    # the bridge's port serves its health only: it binds HTTP_HOST with no such check
    stack.bridge(HTTP_HOST="0.0.0.0")


# --- logs cannot be forged (part 5) ----------------------------------------------------

FORGED_LINE = "2026-11-29T21:00:00 INFO arm_core.bridge.inbox: result applied"


async def test_a_forged_job_id_stays_on_one_line(stack: Stack) -> None:
    bridge = stack.bridge()
    forged = f"\n{FORGED_LINE}"
    assert len(forged) <= 64  # the inbox logs a job_id of an invalid envelope up to 64
    nc = await nats_client(stack.nats.url())
    try:
        for job_id in (forged, f"\r{FORGED_LINE[:40]}\x1b[2J\u2028"):
            body = envelope(uuid.uuid4(), uuid.uuid4(), "done")
            body["job_id"] = job_id
            await send(nc, body, f"{uuid.uuid4()}:1")
    finally:
        await nc.close()
    await wait_for(lambda: bridge.log().count("action=inbox_drop") == 2, 20, bridge.log)
    text = bridge.log()
    lines = text.splitlines()
    assert len(lines) == text.count("\n")  # only newlines break the log's lines
    drops = [line for line in lines if "action=inbox_drop" in line]
    assert all("reason=schema" in line for line in drops), drops
    assert r'job_id="\n2026-11-29T21:00:00 INFO arm_core.bridge.inbox: result ' in drops[0]
    assert r'job_id="\r2026-11-29T21:00:00' in drops[1] and r"\x1b[2J\u2028" in drops[1]
    assert not any(line.startswith(FORGED_LINE[:19]) for line in lines), lines
    assert "\x1b" not in text and "\r" not in text
