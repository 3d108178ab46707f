"""`arm-core dev`: the whole exchange on one machine, for a newcomer.

Starts an embedded PostgreSQL (the system's server binaries, data under .dev/) and an
embedded nats-server unless DATABASE_URL / NATS_URL are given; migrates; runs the API
with the bridge and the reference recognition services; uploads a few demo files the
way upstream does (plain SQL) and prints each file's way to a final status. Ctrl-C (or
SIGTERM) stops everything it started. A second run reuses .dev/.

Its stdout is for a person: the operator console's URL first, then the banner and the
status feed. The processes' own logs (API and bridge, reference services) go to files
under .dev/logs/ in LOG_FORMAT, so they do not bury the feed — unless DEBUG is set: then
they stay on stderr, as `serve` writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import psycopg
from aiohttp import web
from psycopg.rows import dict_row

from arm_core.access import ApiToken, Level
from arm_core.config import Settings
from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.reference import PIPELINES, SCAN, TABULAR
from arm_core.devtools.testbed.sql import pipeline_for
from arm_core.logs import Redactor, setup_logging
from arm_core.migrate import migrate

# Shorter periods than production, so the demo shows dlq and timeout within a minute or two.
DEV_DEFAULTS = {
    "ACK_TIMEOUT_SECONDS": ("ack_timeout_seconds", 10.0),
    "OUTBOX_POLL_SECONDS": ("outbox_poll_seconds", 1.0),
    "TABULAR_REPLY_TIMEOUT_SECONDS": ("tabular_reply_timeout_seconds", 60.0),
    "IMAGE_REPLY_TIMEOUT_SECONDS": ("image_reply_timeout_seconds", 60.0),
    "TIMEOUT_SWEEP_SECONDS": ("timeout_sweep_seconds", 5.0),
}

# Unless AUTH_MODE is given: the API and the console ask for a token, and these two are
# configured — one that may only look, one that may also retry. Printed in the banner and
# named in the README: they are for trying it on this machine (HTTP_HOST is loopback
# unless set otherwise), never for a server others reach.
DEV_TOKENS = (
    ApiToken("viewer", "viewer-token-for-trying-it", Level.VIEWER),
    ApiToken("operator", "operator-token-for-trying-it", Level.OPERATOR),
)

# (original name, file type, what the reference services will do with it)
DEMO_FILES = [
    ("ОСВ 60 сентябрь 2026.xlsx", "XLSX", "done"),
    ("ОСВ 62 РБ 3 квартал.xls", "XLS", "done"),
    ("Акт сверки (скан).pdf", "PDF", "done"),
    ("ОСВ повреждённая [fail].xlsb", "XLSB", "error UNSUPPORTED_FORMAT"),
    ("Счёт-фактура [noack].png", "PNG", "dlq NO_ACK after republishes (~40 s)"),
    ("ОСВ 41 [silent].xlsx", "XLSX", "timeout after its reply deadline (~60 s)"),
]

FINAL = {"done", "needs_check", "error", "timeout", "dlq"}


# The production shape's answer capture (docs/not-losing-answers.md) on the embedded
# nats-server, which runs with JetStream; not on a server given by NATS_URL, which may not.
DEV_RESULTS_STREAM = "arm_results"


def dev_settings(
    settings: Settings, database_url: str, nats_url: str, http_port: int, embedded_nats: bool
) -> Settings:
    changes: dict[str, Any] = {
        "database_url": database_url,
        "nats_urls": (nats_url,),
        "nats_enabled": True,
        "http_port": http_port,
    }
    if embedded_nats and "RESULTS_STREAM" not in settings.explicit:
        changes["results_stream"] = DEV_RESULTS_STREAM
    if "AUTH_MODE" not in settings.explicit:
        changes.update(auth_mode="token", api_tokens=DEV_TOKENS)
    for env, (name, value) in DEV_DEFAULTS.items():
        if env not in settings.explicit:
            changes[name] = value
    dev = settings.model_copy(update=changes)  # each change counts as given (explicit)
    dev.check_results_stream()  # its shorter ACK_TIMEOUT_SECONDS against a window given
    return dev


def seed_demo(
    database_url: str, services: Collection[str] = (TABULAR, SCAN)
) -> list[dict[str, Any]]:
    """Uploads the demo files as upstream does: s3_object, stored_file, queued job, then
    the file's current job — plain SQL, one transaction per file. `services`: the
    reference services running (REFERENCE_SERVICES); what becomes of a file whose
    service is not among them is up to the service that takes its place."""
    seeded = []
    batch = time.strftime("%H%M%S")
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        for name, file_type, expect in DEMO_FILES:
            with conn.transaction():
                key = f"uploads/demo-{batch}/{uuid.uuid4()}/{name}"
                obj = conn.execute(
                    "INSERT INTO arm.s3_object (bucket, key, bucket_role, created_by) "
                    "VALUES ('arm-ka', %s, 'uploads', 'arm-core dev') RETURNING id",
                    (key,),
                ).fetchone()
                f = conn.execute(
                    "INSERT INTO arm.stored_file (consolidation_id, original_name, file_type, "
                    "s3_object_id) VALUES (%s, %s, %s, %s) RETURNING id",
                    (uuid.uuid4(), name, file_type, obj["id"] if obj else None),
                ).fetchone()
                assert f is not None
                pipeline = pipeline_for(file_type)
                j = conn.execute(
                    "INSERT INTO arm.recognition_job (file_id, pipeline, attempt) "
                    "VALUES (%s, %s, 1) RETURNING id",
                    (f["id"], pipeline),
                ).fetchone()
                assert j is not None
                conn.execute(
                    "UPDATE arm.stored_file SET current_recognition_job_id = %s WHERE id = %s",
                    (j["id"], f["id"]),
                )
            service = next(s for s, p in PIPELINES.items() if p == pipeline)
            if service not in services:
                expect = f"whatever your {service} answers"
            seeded.append({"file_id": f["id"], "name": name, "expect": expect})
    return seeded


async def watch(database_url: str, files: list[dict[str, Any]], stopping: asyncio.Event) -> None:
    """Prints every status change of the demo files' current jobs."""
    seen: dict[uuid.UUID, tuple[int, str]] = {}
    names = {f["file_id"]: f["name"] for f in files}
    announced = False
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        while not stopping.is_set():
            cur = await conn.execute(
                "SELECT f.id, j.attempt, j.status::text, j.error_code FROM arm.stored_file f "
                "JOIN arm.recognition_job j ON j.id = f.current_recognition_job_id "
                "WHERE f.id = ANY(%s)",
                (list(names),),
            )
            for file_id, attempt, status, error in await cur.fetchall():
                if seen.get(file_id) != (attempt, status):
                    seen[file_id] = (attempt, status)
                    extra = f" ({error})" if error else ""
                    mark = (
                        "ok"
                        if status in ("done", "needs_check")
                        else ("!!" if status in FINAL else "..")
                    )
                    print(
                        f"  {time.strftime('%H:%M:%S')} {mark} {names[file_id]}: "
                        f"attempt {attempt} {status}{extra}",
                        flush=True,
                    )
            everything_final = len(seen) == len(names) and all(s in FINAL for _, s in seen.values())
            if everything_final and not announced:
                announced = True
                print(
                    "  every demo file reached a final status; the API keeps serving "
                    "(retry one and watch it here; Ctrl-C stops everything)",
                    flush=True,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), 1)


@contextlib.contextmanager
def embedded_servers(settings: Settings, root: Path) -> Iterator[tuple[str, str]]:
    """Embedded PostgreSQL and nats-server where no URL is given; stopped on exit."""
    pg: EmbeddedPostgres | None = None
    nats_server: EmbeddedNats | None = None
    try:
        if settings.database_url:
            database_url = settings.database_url
        else:
            pg = EmbeddedPostgres(base_dir=root / "postgres").start()
            pg.create_database("arm")
            database_url = pg.url("arm")
        if "NATS_URL" in settings.explicit:
            nats_url = settings.nats_urls[0]
        else:
            nats_server = EmbeddedNats(
                log_dir=root / "nats", extra_args=["-js", "-sd", str(root / "nats" / "jetstream")]
            ).start()
            nats_url = nats_server.url()
        yield database_url, nats_url
    finally:
        if nats_server is not None:
            nats_server.stop()
        if pg is not None:
            pg.stop()


async def serve_dev(settings: Settings, root: Path) -> None:
    from arm_core.devtools.reference import configs_from_env, run_reference
    from arm_core.runtime import create_app

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)

    runner = web.AppRunner(create_app(settings), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.http_host, settings.http_port).start()
    # A service of 2 workers × 2 s a file: a capacity for pacing (PACING=auto) to find,
    # shown in the console's pacing panel as files are uploaded.
    env = {
        "REFERENCE_RESULTS_DIR": str(root / "results"),
        "REFERENCE_DELAY_SECONDS": "2",
        "REFERENCE_WORKERS": "2",
    }
    configs = configs_from_env(settings, {**env, **os.environ})
    reference = asyncio.create_task(run_reference(settings, configs, stopping))
    try:
        files = seed_demo(settings.require_database_url(), [c.service for c in configs])
        base = f"http://{settings.http_host}:{settings.http_port}"
        print(banner(settings, base, root, files), flush=True)
        await watch(settings.require_database_url(), files, stopping)
    finally:
        stopping.set()
        await reference
        await runner.cleanup()
        print("arm-core dev stopped", flush=True)


def banner(settings: Settings, base: str, root: Path, files: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "arm-core dev is running — Ctrl-C stops everything it started",
        f"  console      {base}/",
        f"  API          {base}/api/v1/files/<file_id>   (POST …/retry to retry)",
        f"  OpenAPI      {base}/api/v1/openapi.json",
        f"  health       {base}/healthcheck",
        f"  PostgreSQL   psql '{settings.database_url}'",
        f"  NATS         {settings.nats_urls[0]}"
        + (
            f" (answers kept in JetStream stream {settings.results_stream})"
            if settings.results_stream
            else ""
        ),
        f"  results      {root / 'results'} (the reference services' stand-in for S3)",
        *(
            f"  {'logs' if i == 0 else '':<12} {text}"
            for i, text in enumerate(where_logs_go(settings, root))
        ),
        "",
        "Demo uploads (plain SQL, as upstream does):",
    ]
    lines += [f"  {f['file_id']}  {f['name']:<32} → {f['expect']}" for f in files]
    first = files[3]["file_id"] if len(files) > 3 else files[0]["file_id"]
    viewer = operator = ""
    if settings.api_tokens == DEV_TOKENS and settings.auth_mode == "token":
        viewer, operator = (f" -H 'Authorization: Bearer {t.token}'" for t in DEV_TOKENS)
        lines += [
            "",
            "Sign in to the console (and call the API) with a token:",
            *(f"  {t.level:<12} {t.token}" for t in DEV_TOKENS if t.level),
            "  (a viewer may look; an operator may also retry)",
        ]
    lines += [
        "",
        "Try:",
        f"  curl -s{viewer} {base}/api/v1/files/{first}",
        f"  curl -s -X POST{operator} {base}/api/v1/files/{first}/retry     # after it fails",
        f"  psql '{settings.database_url}' -c 'SELECT name, run_every, last_result "
        "FROM arm.periodic_task'",
        "",
        "Status changes:",
    ]
    return "\n".join(lines)


REFERENCE_LOGGER = "arm_core.devtools.reference"


def log_files(root: Path) -> tuple[Path, Path]:
    """Where the logs go without DEBUG: the API's and the bridge's (and migrate's, and
    anything else's), and the reference services'."""
    return root / "logs" / "serve.log", root / "logs" / "reference.log"


def where_logs_go(settings: Settings, root: Path) -> list[str]:
    if settings.debug:
        return ["stderr (DEBUG is set)"]
    serve, reference = log_files(root)
    return [
        f"{serve} (API, bridge), {reference} (reference services)",
        f"PostgreSQL's and NATS's under {root / 'postgres'} and {root / 'nats'}",
    ]


@contextlib.contextmanager
def logs_to_files(settings: Settings, root: Path) -> Iterator[None]:
    """Without DEBUG: every log record to a file under root/logs (in LOG_FORMAT, secrets
    masked), the reference services' to their own; an error (a crash included) is also
    written to stderr, so a failure is never only in a file. With DEBUG: as set up."""
    if settings.debug:
        yield
        return
    serve_path, reference_path = log_files(root)
    serve_path.parent.mkdir(parents=True, exist_ok=True)
    serve = logging.FileHandler(serve_path, encoding="utf-8")
    serve.addFilter(lambda r: not r.name.startswith(REFERENCE_LOGGER))
    reference = logging.FileHandler(reference_path, encoding="utf-8")
    reference.addFilter(logging.Filter(REFERENCE_LOGGER))
    errors = logging.StreamHandler()  # stderr
    errors.setLevel(logging.ERROR)
    root_logger = logging.getLogger()
    before = root_logger.handlers[:]
    setup_logging(
        False, Redactor(settings.secrets()), settings.log_format, [serve, reference, errors]
    )
    try:
        yield
    finally:
        root_logger.handlers[:] = before
        serve.close()
        reference.close()


def run(settings: Settings) -> int:
    root = Path(os.environ.get("ARM_DEV_DIR", ".dev")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    port = settings.http_port if "HTTP_PORT" in settings.explicit else _port_or_free(8080)
    # The console first, before anything else (it answers once the stack is up).
    print(f"console: http://{settings.http_host}:{port}/", flush=True)
    print(f"logs: {where_logs_go(settings, root)[0]}", flush=True)
    with logs_to_files(settings, root), embedded_servers(settings, root) as urls:
        database_url, nats_url = urls
        embedded_nats = "NATS_URL" not in settings.explicit
        settings = dev_settings(settings, database_url, nats_url, port, embedded_nats)
        migrate(database_url, settings)
        asyncio.run(serve_dev(settings, root))
    return 0


def _port_or_free(preferred: int) -> int:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred
