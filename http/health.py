"""The process's own endpoints, on `arm-core serve`'s port and on `arm-core bridge`'s
health port: GET /healthcheck, /livez, /readyz (docs/containers.md says what each
answers) and /metrics (arm_core.metrics)."""

from __future__ import annotations

from aiohttp import web

from arm_core.db import DatabaseError, DatabasePoolExhausted
from arm_core.http.keys import BRIDGE_VIEW, METRICS, SETTINGS, SHUTDOWN, STORE
from arm_core.metrics import AppMetrics, certificate_expiries
from arm_core.version import installed

# What generate_latest writes: the text format 0.0.4, which every Prometheus reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A bridge's NATS side or LISTEN session that holds nothing up: working ("ok", the
# bridge's own word), or not run by this process ("off", NATS_ENABLED=false).
FINE = ("ok", "off")


def bridge_states(app: web.Application) -> tuple[str, str]:
    """The bridge's NATS and LISTEN states (`starting` before it is up)."""
    if not app[SETTINGS].nats_enabled:
        return "off", "off"
    bridge = app.get(BRIDGE_VIEW)
    if bridge is None:
        return "starting", "starting"
    return bridge.nats_state(), bridge.listener_status()


def _unavailable(exc: Exception) -> str:
    """The database's state after a failed read, named by the driver's error."""
    cause = exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ else exc
    return f"unavailable: {type(cause).__name__}"


async def healthcheck(request: web.Request) -> web.Response:
    """GET /healthcheck: 503 when the database is down or no connection of the pool came
    free in time. `outbox` is "stuck: …" when the oldest job ready to publish (one pacing
    does not hold back) has waited over OUTBOX_STUCK_SECONDS although NATS is up, or
    this process runs no bridge and so cannot tell."""
    app = request.app
    settings = app[SETTINGS]
    db, outbox = "ok", "ok"
    age: float | None = None
    try:
        age = await app[STORE].outbox_ready_age(
            pool_timeout=min(2.0, settings.db_pool_timeout_seconds)
        )
    except DatabasePoolExhausted as exc:
        # The database answers: this process's connections are all busy (not an outage).
        db = f"pool exhausted: all {exc.figures.max_size} connections in use"
        outbox = "unknown"
    except Exception as exc:
        db, outbox = _unavailable(exc), "unknown"
    nats, _ = bridge_states(app)
    if age is not None and age > settings.outbox_stuck_seconds and nats in FINE:
        outbox = (
            f"stuck: the oldest job ready to publish has waited {age:.0f} s "
            f"(OUTBOX_STUCK_SECONDS={settings.outbox_stuck_seconds:g})"
        )
    status = "ok" if db == "ok" and nats in FINE and outbox == "ok" else "degraded"
    body = {"status": status, "db": db, "nats": nats, "outbox": outbox, "version": installed()}
    return web.json_response(body, status=200 if db == "ok" else 503)


async def livez(request: web.Request) -> web.Response:
    """GET /livez: 503 when a loop of the bridge crashed past SERVICE_RESTART_LIMIT or
    has had no heartbeat for LIVENESS_STALL_SECONDS (what a restart fixes)."""
    bridge = request.app.get(BRIDGE_VIEW)
    ok, loops = bridge.supervisor.live() if bridge is not None else (True, {})
    body = {"status": "alive" if ok else "dead", "loops": loops}
    return web.json_response(body, status=200 if ok else 503)


async def readyz(request: web.Request) -> web.Response:
    """GET /readyz: 503, with what is missing, unless the database answers, the bridge
    (when it runs) has NATS and its LISTEN session, and the process is not stopping."""
    app = request.app
    try:
        await app[STORE].answers(pool_timeout=min(2.0, app[SETTINGS].db_pool_timeout_seconds))
        db = "ok"
    except Exception as exc:
        db = _unavailable(exc)
    nats, listen = bridge_states(app)
    draining = app[SHUTDOWN].is_set()
    ok = db == "ok" and nats in FINE and listen in FINE and not draining
    status = "ready" if ok else "not_ready"
    body = {"status": status, "db": db, "nats": nats, "listen": listen, "draining": draining}
    return web.json_response(body, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    body = await request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def install_health(app: web.Application) -> None:
    """The four endpoints on `app`, with the gauges /metrics and /api/v1/status read."""
    settings = app[SETTINGS]
    app[METRICS] = AppMetrics(
        store=lambda: app[STORE],
        bridge=lambda: app[BRIDGE_VIEW].metrics_state() if BRIDGE_VIEW in app else None,
        ack_timeout=settings.ack_timeout_seconds,
        certificates=certificate_expiries(settings),
    )
    app.router.add_get("/healthcheck", healthcheck)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
