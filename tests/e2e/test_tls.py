"""Accounting documents encrypted in transit, against real servers with certificates the
test makes (trustme): a nats-server that requires TLS and client certificates, a
PostgreSQL that accepts only SSL (`hostssl`) with `sslmode=verify-full`, and `serve` and
the bridge's health port over HTTPS. Each has its negative cases, which fail closed with
a clear error rather than hang; and no log line of any process shows key material."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import (
    ArmProcess,
    Stack,
    listening,
    log_lines,
    running_stack,
)
from arm_core.devtools.testbed.sql import dict_conn, job, upload
from tests.support.tls import Pair, Pki, assert_no_key_material

pytestmark = pytest.mark.integration

ARM_CORE = str(Path(sys.executable).with_name("arm-core"))
stack_of = contextlib.contextmanager(running_stack)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


@pytest.fixture
def other_ca(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "other-ca", name="another CA")


def tls_env(pki: Pki, client: Pair | None) -> dict[str, str]:
    env = {"NATS_TLS_CA_FILE": str(pki.ca_file)}
    if client is not None:
        env |= {"NATS_TLS_CERT_FILE": str(client.cert), "NATS_TLS_KEY_FILE": str(client.key)}
    return env


def health(url: str, context: ssl.SSLContext | None = None) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def logs(stack: Stack, *more: ArmProcess) -> dict[str, str]:
    return {str(p.log_path): p.log() for p in [*stack.procs, *more]}


# --- NATS: TLS required, client certificates verified -------------------------------------


@pytest.fixture
def tls_stack(db_url: str, tmp_path: Path, pki: Pki) -> Iterator[Stack]:
    """A nats-server that speaks only TLS and wants a client certificate of `pki`'s CA
    (--tlsverify); its certificate names localhost alone."""
    server = pki.issue("nats-server", "localhost")
    args = ["--tlsverify", "--tlscert", str(server.cert), "--tlskey", str(server.key)]
    args += ["--tlscacert", str(pki.ca_file)]
    yield from running_stack(db_url, tmp_path, nats_args=args)


async def test_nats_over_mutual_tls_carries_a_job_and_refuses_the_rest(
    tls_stack: Stack, pki: Pki, other_ca: Pki
) -> None:
    stack = tls_stack
    port = stack.nats.port
    by_name = f"nats://localhost:{port}"
    client = pki.issue("arm-core-bridge")
    await a_job_goes_done(
        stack, by_name, tls_env(pki, client), tls_env(pki, pki.issue("tabular-parser"))
    )

    # Refused, each with the reason in its log within seconds, and /healthcheck says so.
    refused = {
        "no client certificate": (tls_env(pki, None), by_name, "certificate required"),
        "a certificate of another CA": (
            tls_env(pki, other_ca.issue("stranger")),
            by_name,
            "unknown ca",
        ),
        "the server's certificate from another CA": (
            tls_env(other_ca, client),
            by_name,
            "certificate verify failed",
        ),
        "a name the server's certificate does not have": (
            tls_env(pki, client),
            f"nats://127.0.0.1:{port}",
            "IP address mismatch",
        ),
        "plain nats:// with no TLS configured": ({}, by_name, "certificate verify failed"),
    }
    started: dict[str, tuple[ArmProcess, int]] = {}
    for case, (env, url, _) in refused.items():
        health_port = free_port()
        proc = stack.start("bridge", NATS_URL=url, BRIDGE_HEALTH_PORT=health_port, **env)
        started[case] = (proc, health_port)
    for case, (proc, health_port) in started.items():
        words = refused[case][2]
        await wait_for(
            partial(said, proc, "nats_error", words),
            20,
            partial(log_tail, proc, f"{case}: a nats_error naming the refusal"),
        )
        _, body = health(f"http://127.0.0.1:{health_port}/healthcheck")
        assert body["status"] != "ok" and body["nats"] != "ok", (case, body)
        assert proc.proc.poll() is None  # it goes on trying, and says why
    assert_no_key_material(logs(stack), pki, other_ca)
    assert "-----BEGIN" not in stack.nats.log_path.read_text()


async def test_tls_first_carries_a_job_and_sends_nothing_in_clear(
    db_url: str, tmp_path: Path, pki: Pki
) -> None:
    """NATS_TLS_HANDSHAKE_FIRST with servers of `tls { handshake_first: true }`: the job
    goes through; a client with it meets a server that speaks in clear (or anything
    else at that address) with a failed handshake, having sent nothing but its
    ClientHello; a client without it gets no answer from the server, and says so."""
    server = pki.issue("nats-server", "localhost")
    conf = tmp_path / "tls-first.conf"
    conf.write_text(
        "tls {\n"
        f'  cert_file: "{server.cert}"\n  key_file: "{server.key}"\n'
        f'  ca_file: "{pki.ca_file}"\n  verify: true\n  handshake_first: true\n'
        "}\n"
    )
    client = tls_env(pki, pki.issue("arm-core-bridge"))
    first = {**client, "NATS_TLS_HANDSHAKE_FIRST": "true"}
    with stack_of(db_url, tmp_path / "first", nats_args=["-c", str(conf)]) as stack:
        url = f"nats://localhost:{stack.nats.port}"
        service = {**tls_env(pki, pki.issue("tabular-parser")), "NATS_TLS_HANDSHAKE_FIRST": "true"}
        await a_job_goes_done(stack, url, first, service)
        waiting = stack.start("bridge", NATS_URL=url, BRIDGE_HEALTH_PORT=free_port(), **client)
        # It waits for the server's INFO, which a TLS-first server never sends in clear:
        # its own timeout, or the server closing first on a loaded machine.
        await wait_for(
            lambda: (
                said(waiting, "nats_error", "Timeout")
                or said(waiting, "nats_error", "expecting INFO message")
            ),
            20,
            partial(log_tail, waiting, "a client that waits for the server's INFO gives up"),
        )
        assert_no_key_material(logs(stack), pki)
    plain = EmbeddedNats(log_dir=tmp_path / "plain").start()  # no TLS at all
    try:
        with stack_of(db_url, tmp_path / "plain-stack") as stack:
            health_port = free_port()
            refused = stack.start(
                "bridge",
                NATS_URL=f"nats://localhost:{plain.port}",
                BRIDGE_HEALTH_PORT=health_port,
                **first,
            )
            await wait_for(
                partial(said, refused, "nats_error", "SSL"),
                20,
                partial(log_tail, refused, "the handshake with a server in clear fails"),
            )
            _, body = health(f"http://127.0.0.1:{health_port}/healthcheck")
            assert body["nats"] != "ok", body
    finally:
        plain.stop()


# --- PostgreSQL: hostssl only, verify-full ------------------------------------------------


def ssl_only_postgres(base: Path, pki: Pki) -> EmbeddedPostgres:
    """A PostgreSQL of its own with ssl=on, a certificate for 127.0.0.1 of `pki`'s CA, and
    a pg_hba.conf that lets TCP clients in only over SSL (`hostssl`)."""
    pg = EmbeddedPostgres(base_dir=base).start()
    pg.create_database("arm")
    pg.stop()
    server = pki.issue("postgres", "127.0.0.1")  # not localhost: a name it does not have
    for source, name in ((server.cert, "server.crt"), (server.key, "server.key")):
        target = pg.data_dir / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
        stat = pg.data_dir.stat()
        os.chown(target, stat.st_uid, stat.st_gid)
    (pg.data_dir / "pg_hba.conf").write_text(
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n"
    )
    pg.settings |= {"ssl": "on", "ssl_cert_file": "server.crt", "ssl_key_file": "server.key"}
    return pg.start()


def migrate(url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "DATABASE_"))}
    return subprocess.run(
        [ARM_CORE, "migrate"],
        env={**env, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_postgresql_with_verify_full_and_a_server_that_wants_ssl(
    tmp_path: Path, pki: Pki, other_ca: Pki
) -> None:
    pg = ssl_only_postgres(tmp_path / "pg", pki)
    try:
        base = f"postgresql://postgres@127.0.0.1:{pg.port}/arm"
        url = f"{base}?sslmode=verify-full&sslrootcert={pki.ca_file}"
        done = migrate(url)
        assert done.returncode == 0, done.stderr
        with dict_conn(url) as conn:
            assert conn.execute(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            ).fetchone() == {"ssl": True}
            up = upload(conn)
        with stack_of(url, tmp_path / "stack") as stack:
            _, served = stack.serve(NATS_ENABLED="false")
            status, body = health(f"{served}/healthcheck")
            assert (status, body["db"]) == (200, "ok")
            stack.bridge()
            await wait_for(
                partial(status_is, url, up.job_id, "published"),
                20,
                "the bridge publishes the job it read over TLS",
            )
            assert_no_key_material(logs(stack), pki)

        # Refused, and said so: no encryption (the server's pg_hba), another CA, another name.
        refused = {
            "sslmode=disable": (f"{base}?sslmode=disable", "no encryption"),
            "another CA": (
                f"{base}?sslmode=verify-full&sslrootcert={other_ca.ca_file}",
                "certificate verify failed",
            ),
            "another name": (
                f"postgresql://postgres@localhost:{pg.port}/arm?sslmode=verify-full"
                f"&sslrootcert={pki.ca_file}",
                'does not match host name "localhost"',
            ),
        }
        for case, (bad, words) in refused.items():
            done = migrate(bad)
            assert done.returncode == 1, (case, done.stderr)
            assert words in done.stderr, (case, done.stderr)
            assert_no_key_material({case: done.stdout + done.stderr}, pki, other_ca)
    finally:
        pg.stop()


# --- HTTPS: serve and the bridge's health port --------------------------------------------


def test_serve_and_the_bridge_answer_over_https_only(db_url: str, tmp_path: Path, pki: Pki) -> None:
    # Ten days left: /metrics says when, for the expiry alert.
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(days=10)).replace(microsecond=0)
    site = pki.issue("arm-core-site", "127.0.0.1", "localhost", not_after=expires)
    https_env = {"HTTP_TLS_CERT_FILE": str(site.cert), "HTTP_TLS_KEY_FILE": str(site.key)}
    trusted = ssl.create_default_context(cafile=str(pki.ca_file))
    gauge = 'arm_tls_certificate_expiry_timestamp_seconds{variable="HTTP_TLS_CERT_FILE"} '

    with stack_of(db_url, tmp_path) as stack:
        port, bridge_port = free_port(), free_port()
        serve = stack.start("serve", HTTP_PORT=port, **https_env)
        bridge = stack.start("bridge", BRIDGE_HEALTH_PORT=bridge_port, **https_env)
        for proc, p in ((serve, port), (bridge, bridge_port)):
            proc.wait_healthy(p, context=trusted)
            # Plain HTTP on the same port gets no answer; a client that does not trust the
            # CA refuses the certificate.
            with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
                urllib.request.urlopen(f"http://127.0.0.1:{p}/healthcheck", timeout=3).read()
            with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
                urllib.request.urlopen(
                    f"https://127.0.0.1:{p}/healthcheck",
                    timeout=3,
                    context=ssl.create_default_context(),
                )
            # The container's HEALTHCHECK trusts the process's own certificate.
            env = {
                **os.environ,
                **stack.env(HTTP_PORT=port, BRIDGE_HEALTH_PORT=bridge_port, **https_env),
            }
            check = subprocess.run(
                [ARM_CORE, "healthcheck", proc.command],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert check.returncode == 0, check.stdout + check.stderr
            assert check.stdout.startswith(f"https://127.0.0.1:{p}/livez: ")
            metrics = urllib.request.urlopen(
                f"https://127.0.0.1:{p}/metrics", timeout=10, context=trusted
            ).read()
            [line] = [x for x in metrics.decode().splitlines() if x.startswith(gauge)]
            assert float(line.removeprefix(gauge)) == expires.timestamp(), line
        assert log_lines(serve.log(), action="serve")[-1].count("serving on https://") == 1
        assert_no_key_material(logs(stack), pki)


async def a_job_goes_done(
    stack: Stack, url: str, bridge_env: dict[str, str], service_env: dict[str, str]
) -> None:
    """A bridge and the reference service on `url` with their TLS settings; an upload
    goes to done through them."""
    stack.bridge(NATS_URL=url, **bridge_env)
    await listening(stack.reference(NATS_URL=url, **service_env))
    with dict_conn(stack.db_url) as conn:
        up = upload(conn)
    await wait_for(
        partial(status_is, stack.db_url, up.job_id, "done"),
        30,
        partial(log_tail, stack.procs[0], f"the job done over TLS ({url})"),
    )


def status_is(db_url: str, job_id: uuid.UUID, status: str) -> bool:
    with dict_conn(db_url) as conn:
        return bool(job(conn, job_id)["status"] == status)


def said(proc: ArmProcess, action: str, words: str) -> bool:
    """Whether a log line of `proc` with `action` says `words`."""
    return any(words in line for line in log_lines(proc.log(), action=action))


def log_tail(proc: ArmProcess, what: str) -> str:
    return f"{what}: {proc.log()[-2000:]}"


def test_plain_http_off_loopback_is_warned_about_once(db_url: str, tmp_path: Path) -> None:
    with stack_of(db_url, tmp_path) as stack:
        proc = stack.start(
            "serve",
            NATS_ENABLED="false",
            HTTP_HOST="0.0.0.0",
            HTTP_PORT=free_port(),
            AUTH_MODE="token",
            API_TOKENS="ops=a-token-of-sixteen-chars",
        )
        proc.wait_until(partial(said, proc, "serve", "serving on http://0.0.0.0"), 20)
        warned = [line for line in proc.log().splitlines() if "TLS-terminating proxy" in line]
        assert len(warned) == 1 and "WARNING" in warned[0].upper()
