"""RESULTS_STREAM: the core captures answers in a JetStream stream
and consumes it through one durable consumer, acking a message only once its envelope's
outcome is final. Settings, the stream and consumer it makes, the acks, busy envelopes,
garbage, an operator's stream, and a server without JetStream."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig

from arm_core.bridge.service import Fatal
from arm_core.config import Settings
from arm_core.config_error import ConfigError
from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.services import envelope, nats_client, send
from arm_core.devtools.testbed.sql import dict_conn, scalar
from tests.support.bridge import logged, new_bridge, running_bridge
from tests.support.natsauth import nkey_users
from tests.support.shipped_nats import STREAM_PERMISSIONS
from tests.support.stream import STREAM, published_jobs, stream_settings

pytestmark = pytest.mark.integration

SUBJECT = "files.tabular_parsed"


async def ack_all(client: Client, jobs: list[dict[str, Any]]) -> None:
    for row in jobs:
        body = envelope(row["job_id"], row["file_id"], "processing")
        await client.publish(
            SUBJECT, json.dumps(body).encode(), headers={"Nats-Msg-Id": f"ack:{row['job_id']}:1"}
        )
    await client.flush()


async def applied_and_acked(db_url: str, js: JetStreamContext, n: int, within: float) -> None:
    """Waits for n acks applied (n jobs processing), then for the durable consumer to
    have nothing left to deliver or to be acked."""
    processing = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
    with dict_conn(db_url) as conn:
        await wait_for(lambda: scalar(conn, processing) == n, within, f"{n} acks applied")

    async def settled() -> bool:
        c = await js.consumer_info(STREAM, "arm-core")
        return c.num_ack_pending == 0 and c.num_pending == 0

    await wait_for(settled, 30, "every message acked")


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"RESULTS_STREAM": "arm.results"}, "RESULTS_STREAM"),
        ({"RESULTS_STREAM": "ARM RESULTS"}, "RESULTS_STREAM"),
        ({"RESULTS_STREAM": "A", "RESULTS_STREAM_REPLICAS": "6"}, "RESULTS_STREAM_REPLICAS"),
        ({"RESULTS_STREAM": "A", "RESULTS_STREAM_REPLICAS": "0"}, "RESULTS_STREAM_REPLICAS"),
        ({"RESULTS_STREAM_MAX_AGE_SECONDS": "-1"}, "RESULTS_STREAM_MAX_AGE_SECONDS"),
        (
            {"RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS": "x"},
            "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS",
        ),
        (
            {
                "RESULTS_STREAM": "A",
                "RESULTS_STREAM_MAX_AGE_SECONDS": "60",
                "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS": "120",
            },
            "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS",
        ),
        ({"RESULTS_STREAM": "A", "NATS_QUEUE_GROUP": "arm.core"}, "NATS_QUEUE_GROUP"),
        ({"RESULTS_STREAM_MAX_BYTES": "1048575"}, "RESULTS_STREAM_MAX_BYTES"),
        ({"RESULTS_STREAM_MAX_BYTES": "1 GiB"}, "RESULTS_STREAM_MAX_BYTES"),
        (
            {"RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS": "0.05"},
            "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS",
        ),
        # The window must be shorter than the republish interval (ACK_TIMEOUT_SECONDS).
        (
            {"RESULTS_STREAM": "A", "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS": "30"},
            "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS",
        ),
        (
            {
                "RESULTS_STREAM": "A",
                "ACK_TIMEOUT_SECONDS": "5",
                "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS": "10",
            },
            "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS",
        ),
        (
            {"RESULTS_STREAM": "A", "ACK_TIMEOUT_SECONDS": "0.1"},
            "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS",
        ),
        ({"RESULTS_STREAM_ACK_WAIT_SECONDS": "0.5"}, "RESULTS_STREAM_ACK_WAIT_SECONDS"),
        ({"RESULTS_STREAM_ACK_WAIT_SECONDS": "soon"}, "RESULTS_STREAM_ACK_WAIT_SECONDS"),
        # An ack a dead bridge held must come back before its request is sent again.
        (
            {
                "RESULTS_STREAM": "A",
                "ACK_TIMEOUT_SECONDS": "10",
                "RESULTS_STREAM_ACK_WAIT_SECONDS": "11",
            },
            "RESULTS_STREAM_ACK_WAIT_SECONDS",
        ),
    ],
)
def test_bad_stream_settings_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}: "):
        Settings.from_env(env)


def test_stream_settings_defaults() -> None:
    off = Settings.from_env({})
    assert off.results_stream == ""
    on = Settings.from_env({"RESULTS_STREAM": "ARM_RESULTS"})
    assert (
        on.results_stream,
        on.results_stream_replicas,
        on.results_stream_max_age_seconds,
        on.results_stream_max_bytes,
        on.duplicate_window_seconds,
    ) == ("ARM_RESULTS", 1, 7 * 24 * 3600.0, 1 << 30, 10.0)


@pytest.mark.parametrize(
    ("env", "ack_wait"),
    [
        ({}, 30.0),
        ({"ACK_TIMEOUT_SECONDS": "3"}, 30.0),  # not given: nothing to refuse
        ({"ACK_TIMEOUT_SECONDS": "10", "RESULTS_STREAM_ACK_WAIT_SECONDS": "10"}, 10.0),
        ({"RESULTS_STREAM_ACK_WAIT_SECONDS": "5"}, 5.0),
    ],
)
def test_the_stream_ack_wait_is_30_s_unless_given(env: dict[str, str], ack_wait: float) -> None:
    settings = Settings.from_env({"RESULTS_STREAM": "ARM_RESULTS", **env})
    assert settings.stream_ack_wait_seconds == ack_wait


@pytest.mark.parametrize(
    ("env", "window"),
    [
        ({}, 10.0),  # a third of ACK_TIMEOUT_SECONDS' 30
        ({"ACK_TIMEOUT_SECONDS": "10"}, 10 / 3),  # arm-core dev's
        ({"ACK_TIMEOUT_SECONDS": "0.2"}, 0.1),  # never below the server's minimum
        ({"ACK_TIMEOUT_SECONDS": "900"}, 120.0),  # nor above the server's own default
        ({"ACK_TIMEOUT_SECONDS": "30", "RESULTS_STREAM_MAX_AGE_SECONDS": "5"}, 5.0),
        ({"RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS": "29.5"}, 29.5),
    ],
)
def test_the_duplicate_window_is_shorter_than_the_ack_timeout(
    env: dict[str, str], window: float
) -> None:
    settings = Settings.from_env({"RESULTS_STREAM": "ARM_RESULTS", **env})
    assert settings.duplicate_window_seconds == pytest.approx(window)
    assert settings.duplicate_window_seconds < settings.ack_timeout_seconds


def test_arm_core_dev_checks_a_window_given_against_its_own_ack_timeout() -> None:
    """`arm-core dev` shortens ACK_TIMEOUT_SECONDS to 10 s after the environment is read:
    a window of 20 s given with it is refused then, naming the window."""
    from arm_core.devtools.stack import dev_settings

    given = Settings.from_env({"RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS": "20"})
    with pytest.raises(ConfigError, match=r"^RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS: "):
        dev_settings(given, "postgresql://u@h/db", "nats://127.0.0.1:1", 8080, True)
    derived = dev_settings(Settings.from_env({}), "postgresql://u@h/db", "nats://h:1", 8080, True)
    assert derived.duplicate_window_seconds == pytest.approx(10 / 3)


async def test_stream_and_durable_consumer_made_and_every_message_acked_after_commit(
    db_url: str, js_server: EmbeddedNats, js_client: Client
) -> None:
    n = 200
    jobs = published_jobs(db_url, n)
    settings = stream_settings(
        db_url,
        js_server.url(),
        results_stream_max_age_seconds=3600.0,
        # Long, within ACK_TIMEOUT_SECONDS (30): the ack sent again below is within it.
        results_stream_duplicate_window_seconds=25.0,
        results_stream_ack_wait_seconds=12.0,
    )
    async with running_bridge(settings) as bridge:
        js = js_client.jetstream()
        info = await js.stream_info(STREAM)
        assert info.config.subjects == [SUBJECT]
        assert info.config.storage == "file"
        assert (info.config.num_replicas, info.config.max_age) == (1, 3600.0)
        assert (info.config.retention, info.config.discard) == ("interest", "new")
        assert info.config.max_bytes == 1 << 30
        assert info.config.duplicate_window == 25.0
        consumer = await js.consumer_info(STREAM, "arm-core")
        assert consumer.config.durable_name == "arm-core"
        assert consumer.config.ack_policy == "explicit"
        assert consumer.config.max_ack_pending == 20_000
        assert consumer.config.ack_wait == 12.0  # RESULTS_STREAM_ACK_WAIT_SECONDS
        await ack_all(js_client, jobs)  # core NATS publishes, as services send them
        await applied_and_acked(db_url, js, n, within=30)
        assert bridge.inbox.counts["acked"] == n
        assert bridge.nats_state() == "ok"
        # Acked, so gone (interest retention); the same answer again within the window is
        # dropped (its Nats-Msg-Id), though the stream no longer holds the first.
        assert (await js.stream_info(STREAM)).state.messages == 0
        again = jobs[0]
        body = json.dumps(envelope(again["job_id"], again["file_id"], "processing")).encode()
        pub = await js.publish(SUBJECT, body, headers={"Nats-Msg-Id": f"ack:{again['job_id']}:1"})
        assert pub.duplicate


async def test_busy_envelope_is_not_acked_until_applied_and_garbage_is_terminated(
    db_url: str, js_server: EmbeddedNats, js_client: Client
) -> None:
    jobs = published_jobs(db_url, 1)
    async with running_bridge(stream_settings(db_url, js_server.url())) as bridge:
        js = js_client.jetstream()
        with psycopg.connect(db_url) as dba:
            dba.execute("SELECT id FROM arm.recognition_job FOR UPDATE")  # holds the row
            await ack_all(js_client, jobs)
            await wait_for(lambda: bridge.inbox.counts["busy"] >= 2, 30, "busy twice")
            held = await js.consumer_info(STREAM, "arm-core")
            assert held.num_ack_pending == 1  # delivered, not acked while it waits
            dba.rollback()
        await wait_for(lambda: bridge.inbox.counts["applied"] == 1, 30, "applied once free")

        async def acked() -> bool:
            return (await js.consumer_info(STREAM, "arm-core")).num_ack_pending == 0

        await wait_for(acked, 30, "acked after the commit")
        await send(js_client, b"not json", "garbage:1", SUBJECT)
        await wait_for(lambda: bridge.inbox.counts["terminated"] == 1, 30, "garbage terminated")
        await wait_for(acked, 30, "nothing pending")
        assert bridge.inbox.counts["rejected"] == 1


async def test_a_bridge_whose_database_stalls_leaves_the_rest_in_the_stream(
    db_url: str, js_server: EmbeddedNats, js_client: Client
) -> None:
    """While the inbox's batches wait on the database, the bridge takes from the stream
    no more than two batches per worker (INBOX_BATCH_SIZE × INBOX_WORKERS × 2, far below
    INBOX_BUFFER_SIZE); the rest stays in the stream, where another bridge would take
    it, and is applied once the database answers."""
    n, batch, workers = 1000, 50, 2
    cap = 2 * batch * workers
    jobs = published_jobs(db_url, n)
    settings = stream_settings(
        db_url, js_server.url(), inbox_batch_size=batch, inbox_workers=workers
    )
    async with running_bridge(settings) as bridge:
        js = js_client.jetstream()

        async def delivered() -> int:
            c = await js.consumer_info(STREAM, "arm-core")
            return int(c.num_ack_pending)

        with psycopg.connect(db_url) as dba:
            # Every apply of an answer writes arm.stored_file: each worker's batch waits.
            dba.execute("LOCK TABLE arm.stored_file IN ACCESS EXCLUSIVE MODE")
            await ack_all(js_client, jobs)
            await wait_for(lambda: bridge.inbox.held() >= cap, 30, "two batches per worker")
            # The buffers take 10,000: before the cap the bridge fetched every answer at
            # once. Watched for a second (fetches run every few milliseconds): it stays.
            loop = asyncio.get_running_loop()
            until = loop.time() + 1.0
            while loop.time() < until:
                assert bridge.inbox.held() <= cap
                assert await delivered() <= cap + batch * workers  # and the batches in hand
                await asyncio.sleep(0.05)
            pending = (await js.consumer_info(STREAM, "arm-core")).num_pending
            assert pending >= n - cap - batch * workers
            # arm_results_stream_pending: what the last fetch saw still waiting.
            seen = bridge.metrics_state().stream_pending
            assert seen is not None and seen >= pending, (seen, pending)
            dba.rollback()
        await applied_and_acked(db_url, js, n, within=60)
        await wait_for(lambda: bridge.metrics_state().stream_pending == 0, 10, "none left")


async def test_operator_stream_used_as_it_is_with_differences_logged(
    db_url: str, js_server: EmbeddedNats, js_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    js = js_client.jetstream()
    mine = StreamConfig(
        name=STREAM, subjects=["files.>"], storage=StorageType.MEMORY, max_age=600.0
    )
    await js.add_stream(mine)
    jobs = published_jobs(db_url, 3)
    caplog.set_level(logging.INFO)
    async with running_bridge(stream_settings(db_url, js_server.url())) as bridge:
        await ack_all(js_client, jobs)
        await wait_for(lambda: bridge.inbox.counts["acked"] == 3, 30, "applied from the stream")
    info = await js.stream_info(STREAM)
    assert (info.config.subjects, info.config.storage) == (["files.>"], "memory")
    assert info.config.max_age == 600.0
    assert (info.config.retention, info.config.max_bytes) == ("limits", -1)
    (line,) = logged(caplog.records, action="stream_differs")
    assert "storage memory" in line.getMessage() and "max_age 600" in line.getMessage()
    assert "retention limits (arm-core would use interest)" in line.getMessage()


def bridge_process(db_url: str, url: str, tmp_path: Path, **more: str) -> tuple[ArmProcess, int]:
    port = free_port()
    env = {
        "DATABASE_URL": db_url,
        "NATS_URL": url,
        "BRIDGE_HEALTH_PORT": str(port),
        "RESULTS_STREAM": STREAM,
        **more,
    }
    return ArmProcess("bridge", env, tmp_path / f"bridge-{port}.log"), port


@pytest.mark.parametrize("case", ["no_jetstream", "stream_misses_the_subject"])
async def test_results_stream_that_cannot_work_exits_2_naming_it(
    db_url: str, nats_server: EmbeddedNats, js_server: EmbeddedNats, tmp_path: Path, case: str
) -> None:
    if case == "no_jetstream":
        url = nats_server.url()  # the suite's server: no -js
    else:
        url = js_server.url()
        nc = await nats_client(url)
        try:
            await nc.jetstream().add_stream(name=STREAM, subjects=["other.subject"])
        finally:
            await nc.close()
    proc, _ = bridge_process(db_url, url, tmp_path)
    try:
        code = proc.proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running: {proc.log()[-2000:]}") from None
    proc.stop()
    assert code == 2, proc.log()[-2000:]
    assert "arm-core: configuration error: RESULTS_STREAM: " in proc.log()
    expected = "no JetStream" if case == "no_jetstream" else "does not capture"
    assert expected in proc.log()


async def test_server_not_there_yet_keeps_connecting(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    proc, health = bridge_process(db_url, f"nats://127.0.0.1:{port}", tmp_path)
    server = EmbeddedNats(
        port=port, log_dir=tmp_path / "nats", extra_args=["-js", "-sd", str(tmp_path / "js")]
    )
    try:
        await wait_for(
            lambda: (proc.health(health) or {}).get("nats") == "connecting", 30, "connecting"
        )
        assert proc.proc.poll() is None
        server.start()
        await wait_for(lambda: (proc.health(health) or {}).get("nats") == "ok", 30, "connected")
        # The health says ok once the consumer is bound; the line follows the replay's
        # subscription, a moment later.
        await wait_for(
            lambda: "consuming files.tabular_parsed from stream ARM_RESULTS" in proc.log(),
            30,
            "consuming",
        )
    finally:
        code = proc.stop()
        server.stop()
    assert code == 0


async def test_documented_stream_permissions_are_enough(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A jetstream server with exactly the shipped RESULTS_STREAM permissions
    (deploy/nats/nats-permissions.conf): the bridge makes the stream and the consumer,
    keeps the answers for a replay (its two SUBs are not refused), and a job goes
    through; a bridge configured with another byte limit then sets it on the stream."""
    users = nkey_users(STREAM_PERMISSIONS.read_text())
    config = users.write_config(tmp_path)
    config.write_text(config.read_text() + f'\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n')
    server = EmbeddedNats(extra_args=["-c", str(config)], log_dir=tmp_path / "nats").start()
    service = Client()
    try:
        jobs = published_jobs(db_url, 2)
        settings = stream_settings(db_url, server.url(), nats_seed=users.seeds["ARM_CORE_NKEY"])
        await service.connect(server.url(), nkeys_seed_str=users.seeds["TABULAR_PARSER_NKEY"])
        async with running_bridge(settings) as bridge:
            await ack_all(service, jobs)
            await wait_for(lambda: bridge.inbox.counts["acked"] == 2, 30, "applied through it")
            assert bridge.recent is not None and len(bridge.recent) == 2
        assert logged(caplog.records, action="stream_replay_refused") == []
        caplog.set_level(logging.INFO)
        smaller = settings.model_copy(update={"results_stream_max_bytes": 64 << 20})
        async with running_bridge(smaller):
            pass
        (updated,) = logged(caplog.records, action="stream_updated")
        assert f"max_bytes from {1 << 30} to {64 << 20}" in updated.getMessage()
        assert logged(caplog.records, action="stream_differs") == []
    finally:
        await service.close()
        server.stop()


async def test_a_bridge_that_cannot_go_on_tells_its_owner_and_says_refused(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    """The bridge sends no signal: it tells its owner once (`on_fatal`, which stops
    `arm-core bridge` with exit 2: test above), keeps the reason, reports `refused`,
    and stop() works as usual."""
    from psycopg_pool import AsyncConnectionPool

    settings = stream_settings(db_url, nats_server.url())
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        settings.require_database_url(), open=False, min_size=1, max_size=2
    )
    await pool.open(wait=False)
    told: list[Fatal] = []
    bridge = new_bridge(settings, pool, on_fatal=told.append)
    await bridge.start()
    try:
        await wait_for(lambda: bridge.fatal is not None, 30, "the stream refused")
        assert bridge.fatal is not None and bridge.fatal.reason.startswith("RESULTS_STREAM: ")
        assert bridge.fatal.exit_code == 2 and told == [bridge.fatal]
        assert bridge.nats_state() == "refused"
    finally:
        await bridge.stop()
        await pool.close()


async def test_answers_the_stream_missed_are_applied_when_it_elects_a_leader(
    db_url: str, js_server: EmbeddedNats, js_client: Client
) -> None:
    """bridge/replay.py. The stream stops capturing the result subject (as while it has
    no leader), services publish acks with core NATS, the stream captures again and
    announces a leader: the bridge applies the acks it kept from core NATS — and
    without the advisory it does not (nothing else brought them)."""
    n = 20
    jobs = published_jobs(db_url, n)
    settings = stream_settings(db_url, js_server.url())
    processing = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
    async with running_bridge(settings) as bridge:
        js = js_client.jetstream()
        config = (await js.stream_info(STREAM)).config
        await js.update_stream(dataclasses.replace(config, subjects=["elsewhere"]))
        await ack_all(js_client, jobs)  # stored by no one
        await wait_for(lambda: bridge.recent is not None and len(bridge.recent) == n, 10, "kept")
        await js.update_stream(config)
        with dict_conn(db_url) as conn:
            assert scalar(conn, processing) == 0
            assert (await js.stream_info(STREAM)).state.messages == 0
            advisory = {"type": "io.nats.jetstream.advisory.v1.stream_leader_elected"}
            await js_client.publish(
                f"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{STREAM}",
                json.dumps({**advisory, "stream": STREAM, "leader": "n2"}).encode(),
            )
            await wait_for(lambda: scalar(conn, processing) == n, 30, "the kept acks applied")
        assert bridge.inbox.counts["replayed"] == n
        assert bridge.recent is not None and len(bridge.recent) == 0
        # Replayed messages are not the stream's: nothing to acknowledge, nothing failed.
        assert bridge.inbox.counts["acked"] == 0


async def test_answers_the_stream_missed_are_applied_when_the_bridge_reconnects(
    js_server: EmbeddedNats, db_url: str, js_client: Client
) -> None:
    """bridge/replay.py, Replayer.reconnected. The stream misses acks that core NATS
    brought the bridge (as in the test above); then the bridge's connection is cut and
    comes back (a TcpProxy between it and nats-server), and no leader-elected advisory
    is sent: the bridge applies the acks it kept once it is connected again (a leader's
    advisory may have come while it was away)."""
    n = 5
    jobs = published_jobs(db_url, n)
    assert js_server.port is not None
    proxy = await TcpProxy(js_server.port).start()
    # The window outlives a slow reconnect on a loaded machine.
    settings = stream_settings(
        db_url, f"nats://127.0.0.1:{proxy.port}", results_stream_replay_seconds=120.0
    )
    processing = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
    try:
        async with running_bridge(settings) as bridge:
            js = js_client.jetstream()
            config = (await js.stream_info(STREAM)).config
            await js.update_stream(dataclasses.replace(config, subjects=["elsewhere"]))
            await ack_all(js_client, jobs)  # stored by no one
            await wait_for(
                lambda: bridge.recent is not None and len(bridge.recent) == n, 10, "kept"
            )
            await js.update_stream(config)
            assert (await js.stream_info(STREAM)).state.messages == 0
            with dict_conn(db_url) as conn:
                assert scalar(conn, processing) == 0
                reconnects = bridge.nats.stats["reconnects"]
                proxy.block()
                await wait_for(lambda: not bridge.nats.is_connected, 10, "the connection cut")
                proxy.unblock()
                await wait_for(
                    lambda: bridge.nats.stats["reconnects"] > reconnects, 30, "reconnected"
                )
                await wait_for(
                    lambda: scalar(conn, processing) == n,
                    30,
                    lambda: f"the kept acks applied: {bridge.inbox.counts}",
                )
            assert bridge.inbox.counts["replayed"] == n
            assert bridge.recent is not None and len(bridge.recent) == 0
            assert bridge.inbox.counts["acked"] == 0  # nothing came through the stream
    finally:
        await proxy.close()


async def test_without_replay_the_answers_the_stream_missed_stay_lost(
    db_url: str, js_server: EmbeddedNats, js_client: Client
) -> None:
    """RESULTS_STREAM_REPLAY_SECONDS=0: the same sequence leaves the jobs published."""
    jobs = published_jobs(db_url, 5)
    settings = stream_settings(db_url, js_server.url(), results_stream_replay_seconds=0.0)
    async with running_bridge(settings) as bridge:
        assert bridge.recent is None
        js = js_client.jetstream()
        config = (await js.stream_info(STREAM)).config
        await js.update_stream(dataclasses.replace(config, subjects=["elsewhere"]))
        await ack_all(js_client, jobs)
        await js.update_stream(config)
        await js_client.publish(
            f"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{STREAM}", b'{"leader": "n2"}'
        )
        await js_client.flush()
        # One sent again does come through the stream: the bridge is working.
        await ack_all(js_client, jobs[:1])
        with dict_conn(db_url) as conn:
            await wait_for(
                lambda: bridge.inbox.counts["acked"] == 1, 30, "the resent ack through the stream"
            )
            processing = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
            assert scalar(conn, processing) == 1
        assert bridge.inbox.counts["replayed"] == 0
