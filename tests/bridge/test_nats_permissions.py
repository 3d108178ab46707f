"""NATS permissions: deploy/nats/nats-permissions.conf (the results stream, quoted in
docs/service-teams.md) and nats-permissions-core.conf (core NATS only) are the least the
core and the two recognition services need. A real nats-server runs on each verbatim: a
job goes from queued to done through it, and every user is refused everything else; the
two files differ in arm-core's user only. A bridge whose subscription is refused says so
and reports it in the health check instead of running deaf."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from nats.aio.client import Client

from arm_core.bridge.nats_client import auth_options
from arm_core.config import Settings
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.reference import (
    DEFAULT_SUBJECTS,
    SCAN,
    TABULAR,
    ReferenceConfig,
    ReferenceService,
)
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.sql import dict_conn, job, stored_file, upload
from arm_core.runtime import create_app
from arm_core.version import installed
from tests.support.bridge import fast_settings, logged, running_bridge
from tests.support.natsauth import NkeyUsers, nkey_users, user_jwt_for
from tests.support.shipped_nats import CORE_PERMISSIONS, STREAM_PERMISSIONS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FILES = {"core": CORE_PERMISSIONS, "stream": STREAM_PERMISSIONS}

REQUESTS = ("files.tabular_uploaded", "files.img_uploaded")
RESULTS = "files.tabular_parsed"

# What each user may do, written out here independently of the file: the test holds the
# file to it. (subject, queue group) for subscriptions.
# A service may also find the stream that captures its answers and read its PubAcks
# (JetStream publish, docs/service-teams.md): any inbox, any queue group or none.
INBOXES = {
    ("_INBOX.>", queue) for queue in ("", "arm-core", "tabular-parser", "scan-gateway", "other")
}
STREAM_NAMES = "$JS.API.STREAM.NAMES"
JS_INFO = "$JS.API.INFO"
ALLOWED: dict[str, tuple[set[str], set[tuple[str, str]]]] = {
    # Its inbox: the server's "no responders" to a probe (bridge/probes.py).
    "ARM_CORE_NKEY": (set(REQUESTS), {(RESULTS, "arm-core"), *INBOXES}),
    "TABULAR_PARSER_NKEY": (
        {RESULTS, STREAM_NAMES},
        {("files.tabular_uploaded", "tabular-parser"), *INBOXES},
    ),
    "SCAN_GATEWAY_NKEY": (
        {RESULTS, STREAM_NAMES},
        {("files.img_uploaded", "scan-gateway"), *INBOXES},
    ),
}
# Everything else each user is refused: the exchange's subjects and some others, with
# every queue group and none.
PUBLISH_TO = (*REQUESTS, RESULTS, "files.other", "_INBOX.x", JS_INFO, STREAM_NAMES)
SUBSCRIBE_TO = (*REQUESTS, RESULTS, "files.other", "files.>", ">", "_INBOX.>")
QUEUES = ("", "arm-core", "tabular-parser", "scan-gateway", "other")


def allowed(shape: str, user: str) -> tuple[set[str], set[tuple[str, str]]]:
    """What `user` may do under the `shape` file: with the stream, arm-core also calls
    the JetStream API (of which PUBLISH_TO holds $JS.API.INFO)."""
    publish, subscribe = ALLOWED[user]
    if shape == "stream" and user == "ARM_CORE_NKEY":
        return publish | {JS_INFO}, subscribe
    return publish, subscribe


def documented(shape: str = "core") -> str:
    return FILES[shape].read_text()


@asynccontextmanager
async def permissioned_server(
    tmp_path: Path, snippet: str
) -> AsyncIterator[tuple[EmbeddedNats, NkeyUsers]]:
    users = nkey_users(snippet)
    server = EmbeddedNats(
        extra_args=["-c", str(users.write_config(tmp_path))], log_dir=tmp_path / "nats"
    ).start()
    try:
        yield server, users
    finally:
        server.stop()


class Watched:
    """A client of one user that records every asynchronous error the server sends it."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.client = Client()

    async def on_error(self, exc: Exception) -> None:
        self.errors.append(str(exc))

    async def connect(self, url: str, seed: str) -> Watched:
        await self.client.connect(
            url, nkeys_seed_str=seed, error_cb=self.on_error, allow_reconnect=False
        )
        return self

    async def refused(self, what: str) -> str:
        """Waits (with a deadline) for the next error and returns it, or fails naming
        the operation that went through."""
        before = len(self.errors)
        # Two PING/PONGs: the server answers the operation before the second PONG.
        await self.client.flush()
        await self.client.flush()
        await wait_for(lambda: len(self.errors) > before, 5, f"a refusal of {what}")
        return self.errors[-1]


def test_the_service_teams_page_quotes_the_file_and_the_file_names_the_defaults() -> None:
    page = (ROOT / "docs" / "service-teams.md").read_text()
    assert f"```text\n{documented('stream')}```" in page, (
        "docs/service-teams.md must quote deploy/nats/nats-permissions.conf"
    )
    s = Settings()
    for snippet in map(documented, FILES):
        for subject in (s.tabular_request_subject, s.image_request_subject, s.result_subject):
            assert f'"{subject}"' in snippet
        assert f'"{s.result_subject} {s.nats_queue_group}"' in snippet
        for service in (TABULAR, SCAN):
            config = ReferenceConfig(service)
            assert f'"{DEFAULT_SUBJECTS[service]} {config.queue}"' in snippet


def users_block(snippet: str, user: str) -> str:
    """The `{ nkey: $user … }` entry of a file, its comment lines left out."""
    lines = [line for line in snippet.splitlines() if not line.lstrip().startswith("#")]
    start = lines.index(f"      nkey: ${user}") - 1
    end = lines.index("    }", start)
    return "\n".join(lines[start : end + 1])


def test_the_two_files_differ_in_arm_cores_user_only() -> None:
    """The services' users are the same in both: a change to one is made to the other."""
    core, stream = documented("core"), documented("stream")
    for user in ("TABULAR_PARSER_NKEY", "SCAN_GATEWAY_NKEY"):
        assert users_block(core, user) == users_block(stream, user), user
    assert users_block(core, "ARM_CORE_NKEY") != users_block(stream, "ARM_CORE_NKEY")
    # The stream's name and the durable consumer are the deploy examples' and the defaults'.
    assert '"$JS.API.STREAM.CREATE.ARM_RESULTS"' in stream
    assert f'"$JS.API.CONSUMER.INFO.ARM_RESULTS.{Settings().nats_queue_group}"' in stream


@pytest.mark.parametrize("shape", sorted(FILES))
async def test_a_job_goes_through_a_server_with_exactly_the_documented_permissions(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, shape: str
) -> None:
    """The bridge as the core user, each reference service as its own user: a tabular
    and an image upload end `done`, and nobody is refused anything on the way."""
    caplog.set_level(logging.INFO)
    async with permissioned_server(tmp_path, documented(shape)) as (server, users):
        settings = fast_settings(db_url, server.url(), nats_seed=users.seeds["ARM_CORE_NKEY"])
        services: list[tuple[Watched, ReferenceService]] = []
        for service, user in ((TABULAR, "TABULAR_PARSER_NKEY"), (SCAN, "SCAN_GATEWAY_NKEY")):
            watched = await Watched().connect(server.url(), users.seeds[user])
            config = ReferenceConfig(service, delay_seconds=0, results_dir=tmp_path / "bucket")
            reference = ReferenceService(watched.client, config)
            await reference.start()
            services.append((watched, reference))
        try:
            async with running_bridge(settings):
                with dict_conn(db_url) as conn:
                    uploads = [upload(conn, "XLSX"), upload(conn, "PDF")]

                    def statuses() -> list[str]:
                        return [job(conn, up.job_id)["status"] for up in uploads]

                    await wait_for(
                        lambda: statuses() == ["done", "done"], 20, lambda: str(statuses())
                    )
                    files = [stored_file(conn, up.file_id)["status"] for up in uploads]
                    assert files == ["PROCESSING", "PROCESSING"]  # waiting for mapping
        finally:
            for watched, reference in services:
                await reference.stop()
                await watched.client.close()
        assert [r.stats.processed for _, r in services] == [1, 1]
        assert [w.errors for w, _ in services] == [[], []]
        assert logged(caplog.records, action="nats_error") == []
        assert logged(caplog.records, action="nats_connected") != []
    assert "Violation" not in server.log_path.read_text()


@pytest.mark.parametrize("shape", sorted(FILES))
@pytest.mark.parametrize("user", sorted(ALLOWED))
async def test_each_user_is_refused_everything_it_is_not_allowed(
    user: str, shape: str, tmp_path: Path
) -> None:
    """Every publish and every subscription (any queue group or none) outside the user's
    allowance gets a permissions violation; those inside get nothing; the connection
    stays up throughout (a refusal closes nothing)."""
    publish, subscribe = allowed(shape, user)
    async with permissioned_server(tmp_path, documented(shape)) as (server, users):
        watched = await Watched().connect(server.url(), users.seeds[user])
        nc = watched.client
        try:
            for subject in PUBLISH_TO:
                await nc.publish(subject, b"{}")
                if subject in publish:
                    continue
                said = await watched.refused(f"publish to {subject}")
                assert said == f'nats: permissions violation for publish to "{subject}"'.lower()
            for subject in SUBSCRIBE_TO:
                for queue in QUEUES:
                    sub = await nc.subscribe(subject, queue=queue)
                    if (subject, queue) in subscribe:
                        continue
                    said = await watched.refused(f"subscribe to {subject} queue {queue!r}")
                    expected = f'nats: permissions violation for subscription to "{subject}"'
                    expected += f' using queue "{queue}"' if queue else ""
                    assert said == expected.lower()  # nats-py lower-cases the server's -ERR
                    await sub.unsubscribe()
            # What was allowed raised nothing: one refusal per refused operation.
            refused_publishes = len(PUBLISH_TO) - len(publish)
            refused_subscriptions = len(SUBSCRIBE_TO) * len(QUEUES) - len(subscribe)
            await nc.flush()
            await nc.flush()
            assert len(watched.errors) == refused_publishes + refused_subscriptions
            assert nc.is_connected
        finally:
            await nc.close()


def _without_subscribe(snippet: str) -> str:
    """The documented block with the core's queue group misspelt, the mistake an operator
    would make: the core user may not subscribe in its queue group."""
    right = '"files.tabular_parsed arm-core"'
    lines = snippet.splitlines(keepends=True)
    live = [
        i for i, line in enumerate(lines) if right in line and not line.lstrip().startswith("#")
    ]
    assert len(live) == 1
    lines[live[0]] = lines[live[0]].replace(right, '"files.tabular_parsed arm_core"')
    return "".join(lines)


async def test_a_bridge_whose_subscription_is_refused_says_so_and_is_not_healthy(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It would otherwise run deaf: connected, publishing, never hearing an ack. It logs
    an error naming the subject and queue group, never claims to be subscribed, and the
    health check says `nats: refused`, status degraded (still HTTP 200: the API serves)."""
    caplog.set_level(logging.INFO)
    async with permissioned_server(tmp_path, _without_subscribe(documented())) as (server, users):
        settings = fast_settings(db_url, server.url(), nats_seed=users.seeds["ARM_CORE_NKEY"])
        async with TestClient(TestServer(create_app(settings))) as http:
            seen: list[tuple[int, dict[str, str]]] = []

            async def refused() -> bool:
                resp = await http.get("/healthcheck")
                seen.append((resp.status, await resp.json()))
                return seen[-1][1]["nats"] == "refused"

            await wait_for(refused, 10, lambda: f"health says nats: refused: {seen[-1:]}")
    assert seen[-1] == (
        200,
        {
            "status": "degraded",
            "db": "ok",
            "nats": "refused",
            "outbox": "ok",
            "version": installed(),
        },
    )
    refusals = logged(caplog.records, action="nats_subscribe_refused")
    assert [r.levelno for r in refusals] == [logging.ERROR]
    message = refusals[0].getMessage()
    assert '"files.tabular_parsed arm-core"' in message
    assert "permissions violation for subscription" in message
    assert logged(caplog.records, action="nats_connected") == []


def _without_image_publish(snippet: str) -> str:
    """The documented block with the core's publish allowance reduced to the tabular
    subject: an image request is refused by the server."""
    right = '"files.tabular_uploaded", "files.img_uploaded"'
    assert snippet.count(right) == 1, "the core's publish list changed shape"
    return snippet.replace(right, '"files.tabular_uploaded"')


async def test_a_refused_publish_leaves_the_jobs_queued_and_says_why(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server drops a publish the user may not make and keeps the connection: without
    a check, the batch would be confirmed and committed as published, and the job would
    end dlq/NO_ACK. The publisher sees the -ERR that came before its PONG, rolls the
    batch back (the job stays queued, nothing is lost) and logs the refusal."""
    caplog.set_level(logging.INFO)
    async with permissioned_server(tmp_path, _without_image_publish(documented())) as (
        server,
        users,
    ):
        settings = fast_settings(db_url, server.url(), nats_seed=users.seeds["ARM_CORE_NKEY"])
        with dict_conn(db_url) as conn:
            scan = upload(conn, file_type="PDF")
        async with running_bridge(settings) as bridge:
            await wait_for(
                lambda: bridge.publisher.counts["failed_batches"] >= 2,
                10,
                "two refused publish batches",
            )
            with dict_conn(db_url) as conn:
                assert job(conn, scan.job_id)["status"] == "queued"
    refusals = [r for r in logged(caplog.records, action="publish") if r.levelno == logging.ERROR]
    assert refusals, "the refused publish was not logged"
    message = refusals[0].getMessage()
    assert "NATS refused the publish" in message
    assert "files.img_uploaded" in message


async def test_a_seed_with_a_jwt_is_refused_by_the_shipped_users(tmp_path: Path) -> None:
    """The shipped server file defines nkey users, no operator: a client that signs in
    with a JWT beside its seed (operator mode's way) is refused, the seed alone is let in.
    So the deploy examples give the seed only."""
    async with permissioned_server(tmp_path, documented("stream")) as (server, users):
        seed = users.seeds["ARM_CORE_NKEY"]
        jwt = user_jwt_for(seed)
        refused = Client()
        with pytest.raises(Exception, match="Authorization Violation"):
            await refused.connect(
                server.url(),
                allow_reconnect=False,
                **auth_options(Settings(nats_seed=seed, nats_jwt=jwt)),
            )
        let_in = await Watched().connect(server.url(), seed)
        assert let_in.client.is_connected
        await let_in.client.close()
