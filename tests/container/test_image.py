"""The arm-core image as an operator runs it: built from the repository's Containerfile,
run by podman with a read-only root file system as a non-root user, against the suite's
real PostgreSQL and nats-server (docs/containers.md "Running in containers").

The figures that page gives (image size, `podman run` to healthy, SIGTERM to exit with
work in flight) are printed by the tests that measure them (`pytest -s tests/container`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.images import Container, inspect_image, run_once
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, log_lines, runtime_env
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.services import instant_service
from arm_core.devtools.testbed.sql import dict_conn, scalar, upload
from arm_core.version import installed
from tests.support.flow import DONE, Flow, applied_results
from tests.support.tls import Pki, assert_no_key_material

pytestmark = pytest.mark.e2e

API_TOKEN = "operator=container-test-token-0123456789"
# The same fast periods as the e2e stack; a long reply deadline, so a lost answer shows
# as a job left `processing`, never as a quiet timeout.
FAST = {
    "OUTBOX_POLL_SECONDS": "0.2",
    "SCHEDULE_TICK_SECONDS": "0.2",
    "TABULAR_REPLY_TIMEOUT_SECONDS": "600",
    "HTTP_HOST": "127.0.0.1",  # the host's network: listen on loopback only
}


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    started: list[Container] = []
    try:
        yield started
    finally:
        for ctr in started:
            ctr.remove()


def bridge_env(db_url: str, nats_url: str, **extra: str) -> dict[str, str]:
    env = {"DATABASE_URL": db_url, "NATS_URL": nats_url, **FAST, **extra}
    env.setdefault("BRIDGE_HEALTH_PORT", str(free_port()))
    return runtime_env("bridge", env)  # the bridge's own login, as a deployment runs it


def test_the_image_is_arm_core_as_a_non_root_user_with_a_healthcheck(image: str) -> None:
    meta = inspect_image(image)
    config = meta["Config"]
    assert config["User"] == "10001:10001"
    assert config["Labels"]["org.opencontainers.image.version"] == installed()
    assert config["Entrypoint"] == ["arm-core"] and config["Cmd"] == ["bridge"]
    assert config["StopSignal"] in ("SIGTERM", "15")
    assert meta["Healthcheck"]["Test"] == ["CMD", "arm-core", "healthcheck"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["LOG_FORMAT"] == "json" and env["PYTHONUNBUFFERED"] == "1"
    # The runtime stage holds the environment only: no pip, no wheels, no source.
    leftovers = run_once(
        image, ["-c", "test -e /opt/arm-core/bin/pip || test -e /wheels || test -e /src"], {},
        "--entrypoint", "sh",
    )  # fmt: skip
    assert leftovers.returncode == 1, leftovers
    told = run_once(image, ["--version"], {})
    assert told.returncode == 0 and told.stdout.strip() == f"arm-core {installed()}", told
    helped = run_once(image, ["--help"], {})
    assert helped.returncode == 0 and "healthcheck" in helped.stdout
    print(f"\nFIGURE image size: {meta['Size'] / 1e6:.0f} MB ({image})")


def test_migrate_in_a_container(image: str, empty_db_url: str) -> None:
    first = run_once(image, ["migrate"], {"DATABASE_URL": empty_db_url})
    assert first.returncode == 0, first
    assert "migrations: 0001" in first.stdout
    again = run_once(image, ["migrate"], {"DATABASE_URL": empty_db_url})
    assert again.returncode == 0 and "none pending" in again.stdout, again
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regclass('arm.recognition_job')").fetchone() == (
            "arm.recognition_job",
        )


@pytest.mark.parametrize("command", ["bridge", "serve", "migrate"])
def test_a_bad_variable_exits_2_naming_it_without_the_secret(image: str, command: str) -> None:
    env = {
        "DATABASE_URL": "postgresql://arm:s3cr3t-container-pw@127.0.0.1:1/arm",
        "NATS_URL": "nats://svc:s3cr3t-container-pw@127.0.0.1:bad",
    }
    done = run_once(image, [command], env)
    assert done.returncode == 2, done
    assert "NATS_URL" in done.stderr
    assert "s3cr3t-container-pw" not in done.stdout + done.stderr


async def test_the_bridge_in_a_container_takes_an_upload_to_done(
    image: str, db_url: str, nats_server: EmbeddedNats, containers: list[Container]
) -> None:
    service = await instant_service(nats_server.url())  # outside the container
    try:
        # DEBUG: a line per job, so its path shows in the JSON log.
        ctr = Container(image, ["bridge"], bridge_env(db_url, nats_server.url(), DEBUG="true"))
        containers.append(ctr)
        await asyncio.to_thread(ctr.start)
        healthy_in = await asyncio.to_thread(ctr.wait_healthy)
        print(f"\nFIGURE podman run → healthy (bridge): {healthy_in:.2f} s")

        uid = await asyncio.to_thread(ctr.exec, "id", "-u")
        assert uid.stdout.strip() == "10001"
        write = await asyncio.to_thread(ctr.exec, "sh", "-c", "echo x > /opt/arm-core/x")
        assert write.returncode != 0 and "Read-only file system" in write.stderr

        with dict_conn(db_url) as conn:
            up = upload(conn, "XLSX")
            await wait_for(
                lambda: scalar(conn, "SELECT status::text FROM arm.recognition_job WHERE id = %s",
                               (up.job_id,)) == "done",
                30, "the upload done through the container's bridge",
            )  # fmt: skip
        code, _ = await asyncio.to_thread(ctr.stop, "SIGINT")
        assert code == 0, ctr.logs()[-3000:]
    finally:
        await service.client.close()
    # JSON lines on stdout/stderr, as the image's LOG_FORMAT says; the job's path in them.
    lines = [json.loads(line) for line in ctr.logs().splitlines() if line.strip()]
    assert any(str(up.job_id) == line.get("job_id") for line in lines)
    assert any(line.get("message") == "bridge stopped" for line in lines), lines[-5:]


async def test_serve_in_a_container_answers_with_a_token(
    image: str, db_url: str, containers: list[Container]
) -> None:
    port = free_port()
    env = runtime_env(
        "serve",
        {"DATABASE_URL": db_url, "NATS_ENABLED": "false", "HTTP_PORT": str(port),
         "AUTH_MODE": "token", "API_TOKENS": API_TOKEN, **FAST},
    )  # fmt: skip
    ctr = Container(image, ["serve"], env)
    containers.append(ctr)
    await asyncio.to_thread(ctr.start)
    healthy_in = await asyncio.to_thread(ctr.wait_healthy)
    print(f"\nFIGURE podman run → healthy (serve): {healthy_in:.2f} s")
    token = API_TOKEN.split("=", 1)[1]
    status = await asyncio.to_thread(
        ctr.exec, "python3", "-c",
        "import urllib.request as u;"
        f"r=u.urlopen(u.Request('http://127.0.0.1:{port}/api/v1/status',"
        f"headers={{'Authorization':'Bearer {token}'}}));print(r.status)",
    )  # fmt: skip
    assert status.stdout.strip() == "200", status
    code, _ = await asyncio.to_thread(ctr.stop)
    assert code == 0, ctr.logs()[-3000:]


async def test_sigterm_with_work_in_flight_exits_0_and_loses_nothing(
    image: str, stack: Stack, containers: list[Container]
) -> None:
    """Two bridges share a steady flow, one in a container: `podman stop` (SIGTERM) in
    the middle of it. The container leaves the queue group by draining, applies what it
    holds and exits 0 well within the stop timeout; the other bridge goes on; every job
    ends done with its result applied exactly once."""
    debug = {"DEBUG": "true", "LOG_FORMAT": "text", "OUTBOX_BATCH_SIZE": "50",
             "INBOX_BATCH_SIZE": "4", "INBOX_BUFFER_SIZE": "8"}  # fmt: skip
    service = await instant_service(stack.nats.url())
    try:
        host_bridge = await asyncio.to_thread(stack.bridge, **debug)
        ctr = Container(image, ["bridge"], bridge_env(stack.db_url, stack.nats.url(), **debug))
        containers.append(ctr)
        await asyncio.to_thread(ctr.start)
        await asyncio.to_thread(ctr.wait_healthy)
        with Flow(stack.db_url) as flow, dict_conn(stack.db_url) as conn:

            def shared() -> bool:  # podman logs blocks: asked off the event loop
                return scalar(conn, DONE) >= 150 and bool(applied_results([ctr.logs()]))

            await wait_for(lambda: asyncio.to_thread(shared), 60, "the flow in both bridges")
            code, took = await asyncio.to_thread(ctr.stop, "SIGTERM", 60)
            seen = scalar(conn, DONE)

            def stalled() -> str:  # what a failure needs to name its cause
                rows = conn.execute(
                    "SELECT status, count(*) AS n FROM arm.recognition_job GROUP BY status"
                ).fetchall()
                counts = {r["status"]: r["n"] for r in rows}
                return (
                    f"flow goes on ({seen} done at the stop, now {counts}): "
                    + (host_bridge.log()[-3000:])
                )

            await wait_for(lambda: scalar(conn, DONE) >= seen + 150, 60, stalled)
            n = flow.stop()
        with dict_conn(stack.db_url) as conn:
            await wait_for(lambda: scalar(conn, DONE) == n, 120, lambda: f"{n} jobs done")
            with_result = "SELECT count(*) FROM arm.recognition_job WHERE result_msg_id IS NOT NULL"
            assert scalar(conn, with_result) == n
        assert host_bridge.stop() == 0
    finally:
        await service.client.close()
    print(f"\nFIGURE SIGTERM → exit with work in flight: {took:.2f} s (exit {code})")
    text = ctr.logs()
    assert code == 0, text[-3000:]
    assert "bridge stopped" in text and log_lines(text, action="nats_drained")
    assert not log_lines(text, action="inbox_drop"), log_lines(text, action="inbox_drop")
    applied = applied_results([text, host_bridge.log()])
    assert len(applied) == n and set(applied.values()) == {1}  # each once, none twice
    assert applied_results([text])  # the container had its share


async def test_the_healthcheck_is_liveness_and_readiness_follows_the_database(
    image: str, db_url: str, nats_server: EmbeddedNats, containers: list[Container]
) -> None:
    """The image's HEALTHCHECK asks /livez: it keeps passing while the database is cut
    off — `arm-core healthcheck --ready` fails then, naming it, and passes again after —
    and it fails while a loop is stuck (a DBA's lock holds the schedule's query past
    LIVENESS_STALL_SECONDS), which a restart would end."""
    parts = urlsplit(db_url)
    assert parts.port is not None
    proxy = await TcpProxy(parts.port).start()
    via_proxy = urlunsplit(
        parts._replace(netloc=parts.netloc.replace(f":{parts.port}", f":{proxy.port}"))
    )
    try:
        # Off the event loop: bridge_env connects (ensure_logins) through the proxy, which
        # this loop serves; called on it, the connect blocked the loop and waited for the
        # kernel's connect timeout (about two minutes) before the test could go on.
        env = await asyncio.to_thread(bridge_env, via_proxy, nats_server.url())
        # Above the longest wait a loop makes while the database is away (the pool's
        # DATABASE_POOL_TIMEOUT_SECONDS, 5 s), below the test's patience.
        env["LIVENESS_STALL_SECONDS"] = "15"
        ctr = Container(image, ["bridge"], env)
        containers.append(ctr)
        await asyncio.to_thread(ctr.start)
        await asyncio.to_thread(ctr.wait_healthy)

        def ready() -> subprocess.CompletedProcess[str]:
            return ctr.exec("arm-core", "healthcheck", "--ready")

        await wait_for(lambda: asyncio.to_thread(lambda: ready().returncode == 0), 30, "ready")
        proxy.block()
        await wait_for(lambda: asyncio.to_thread(lambda: ready().returncode == 1), 60, "not ready")
        assert '"db": "unavailable' in ready().stderr
        assert (await asyncio.to_thread(ctr.healthcheck)).returncode == 0  # still alive
        proxy.unblock()
        await wait_for(lambda: asyncio.to_thread(lambda: ready().returncode == 0), 60, "ready")
        with dict_conn(db_url) as dba:
            dba.execute("BEGIN")
            dba.execute("LOCK TABLE arm.periodic_task IN ACCESS EXCLUSIVE MODE")
            checks: list[str] = []

            def unhealthy() -> bool:
                done = ctr.healthcheck()
                checks.append(done.stdout + done.stderr)
                return done.returncode == 1

            await wait_for(lambda: asyncio.to_thread(unhealthy), 60, lambda: f"unhealthy: {checks}")
            assert '"schedule": "stalled"' in ctr.exec("arm-core", "healthcheck").stderr
            dba.execute("ROLLBACK")
        await asyncio.to_thread(ctr.wait_healthy)
        code, _ = await asyncio.to_thread(ctr.stop)
        assert code == 0
    finally:
        await proxy.close()


async def test_the_bridge_in_a_container_with_tls_files_mounted_read_only(
    image: str, db_url: str, tmp_path: Path, containers: list[Container]
) -> None:
    """A deployment's TLS: the CA, the client certificate and key, and the health port's
    certificate mounted read-only at /run/secrets (readable by the image's uid 10001
    only); the bridge reaches a nats-server that requires client certificates, publishes
    an upload, and the image's HEALTHCHECK asks its own HTTPS port."""
    pki = Pki(tmp_path / "secrets")
    server = pki.issue("nats-server", "localhost")
    client, site = pki.issue("bridge"), pki.issue("health", "127.0.0.1")
    for path in pki.written:
        os.chown(path, 10001, 10001)  # as a secret store mounts them: the process's own
    nats = EmbeddedNats(
        log_dir=tmp_path / "nats",
        extra_args=["--tlsverify", "--tlscert", str(server.cert), "--tlskey", str(server.key),
                    "--tlscacert", str(pki.ca_file)],
    ).start()  # fmt: skip
    try:
        secrets = "/run/secrets"
        env = bridge_env(
            db_url,
            f"nats://localhost:{nats.port}",
            NATS_TLS_CA_FILE=f"{secrets}/{pki.ca_file.name}",
            NATS_TLS_CERT_FILE=f"{secrets}/{client.cert.name}",
            NATS_TLS_KEY_FILE=f"{secrets}/{client.key.name}",
            HTTP_TLS_CERT_FILE=f"{secrets}/{site.cert.name}",
            HTTP_TLS_KEY_FILE=f"{secrets}/{site.key.name}",
        )
        ctr = Container(image, ["bridge"], env, flags=["-v", f"{pki.root}:{secrets}:ro"])
        containers.append(ctr)
        await asyncio.to_thread(ctr.start)
        await asyncio.to_thread(ctr.wait_healthy)  # over HTTPS
        write = await asyncio.to_thread(ctr.exec, "sh", "-c", f"echo x > {secrets}/x")
        assert write.returncode != 0 and "Read-only file system" in write.stderr
        with dict_conn(db_url) as conn:
            up = upload(conn, "XLSX")
            await wait_for(
                lambda: scalar(conn, "SELECT status::text FROM arm.recognition_job WHERE id = %s",
                               (up.job_id,)) == "published",
                30, "the upload published through TLS from the container",
            )  # fmt: skip
        code, _ = await asyncio.to_thread(ctr.stop, "SIGTERM")
        assert code == 0, ctr.logs()[-3000:]
        assert_no_key_material({"container": ctr.logs()}, pki)
    finally:
        nats.stop()
