"""The `arm-core` console script: migrate, serve, bridge, dev."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from arm_core.config import Settings, is_loopback
from arm_core.config_error import ConfigError
from arm_core.db import DatabaseError
from arm_core.logs import Redactor, escape, setup_logging
from arm_core.version import installed

log = logging.getLogger("arm_core")


def cmd_migrate(settings: Settings) -> int:
    from arm_core.migrate import RolesMissing, migrate

    try:
        report = migrate(settings.require_session_url("migrate"), settings)
    except RolesMissing as exc:
        # The SQL is ours (db/roles.sql, a quoted role name): printed as it is, to be run.
        print(f"arm-core: {escape(exc)}\n\n{exc.sql}", file=sys.stderr, end="")
        return 1
    applied = ", ".join(report.applied_migrations) or "none pending"
    print(f"migrations: {applied}; functions: {len(report.function_files)} files applied")
    return 0


def cmd_rollback(settings: Settings, migration: str) -> int:
    from arm_core.migrate import UnknownMigration, rollback_to

    try:
        done = rollback_to(settings.require_session_url("rollback"), migration)
    except UnknownMigration as exc:
        print(f"arm-core: {escape(exc)}", file=sys.stderr)
        return 2
    print(
        f"rolled back: {', '.join(done) or 'nothing (none of them was applied)'}; now run "
        "the previous version's `arm-core migrate`, which applies its functions"
    )
    return 0


def _run(app: object, host: str, port: int) -> int:
    from aiohttp import web

    from arm_core.http.server import run

    assert isinstance(app, web.Application)
    # run handles SIGINT and SIGTERM: cleanup contexts stop the bridge (the batch in
    # flight commits or rolls back) and close the pool. Its server answers unparsable
    # requests in JSON and cuts off slow clients (HTTP_*_TIMEOUT_SECONDS).
    run(app, host, port)
    from arm_core.runtime import BRIDGE

    bridge = app.get(BRIDGE)
    fatal = bridge.fatal if bridge is not None else None
    if fatal is None:
        return 0
    if fatal.exit_code == 2:  # e.g. RESULTS_STREAM without JetStream
        print(f"arm-core: configuration error: {escape(fatal.reason)}", file=sys.stderr)
    else:  # a loop that kept crashing: its supervisor starts a fresh process
        print(f"arm-core: stopped: {escape(fatal.reason)}", file=sys.stderr)
    return fatal.exit_code


def cmd_serve(settings: Settings) -> int:
    from arm_core.http.server import defer_stop_signals
    from arm_core.runtime import create_app

    defer_stop_signals()
    settings.require_database_url()
    if settings.nats_enabled:
        settings.listen_url()  # DATABASE_LISTEN_URL, when it is required: exit 2 now
    settings.require_safe_exposure()  # AUTH_MODE=none off loopback needs AUTH_ALLOW_ANONYMOUS
    if settings.auth_mode == "none" and not is_loopback(settings.http_host):
        log.warning(
            "AUTH_ALLOW_ANONYMOUS=true: anyone who can reach %s:%d may retry files, "
            'audited as "anonymous"',
            settings.http_host,
            settings.http_port,
            extra={"action": "serve"},
        )
    scheme = "https" if settings.http_tls_cert_file else "http"
    if scheme == "http" and not is_loopback(settings.http_host):
        log.warning(
            "serving plain HTTP on %s, which other machines can reach: put a "
            "TLS-terminating proxy in front, or set HTTP_TLS_CERT_FILE and HTTP_TLS_KEY_FILE",
            settings.http_host,
            extra={"action": "serve"},
        )
    log.info(
        "serving on %s://%s:%d (NATS %s)",
        scheme,
        settings.http_host,
        settings.http_port,
        "enabled" if settings.nats_enabled else "disabled",
        extra={"action": "serve"},
    )
    return _run(create_app(settings), settings.http_host, settings.http_port)


def cmd_bridge(settings: Settings) -> int:
    from arm_core.http.server import defer_stop_signals
    from arm_core.runtime import bridge_app

    defer_stop_signals()
    settings.require_database_url()
    if not settings.nats_enabled:
        raise ConfigError("NATS_ENABLED: is false, so `arm-core bridge` has nothing to do")
    settings.listen_url()  # DATABASE_LISTEN_URL, when it is required: exit 2 now
    log.info(
        "bridge health on %s://%s:%d/healthcheck",
        "https" if settings.http_tls_cert_file else "http",
        settings.http_host,
        settings.bridge_health_port,
        extra={"action": "bridge"},
    )
    return _run(bridge_app(settings), settings.http_host, settings.bridge_health_port)


def cmd_reference(settings: Settings) -> int:
    """Reference recognition services (REFERENCE_SERVICES=tabular-parser,scan-gateway,
    REFERENCE_MODE, …) for demos and end-to-end tests; not a production component."""
    import asyncio
    import signal

    from arm_core.devtools.reference import configs_from_env, run_reference

    configs = configs_from_env(settings)  # ConfigError names the bad variable

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        await run_reference(settings, configs, stopping)

    asyncio.run(main())
    return 0


def cmd_healthcheck(settings: Settings, command: str | None, ready: bool = False) -> int:
    """The container's HEALTHCHECK: 0 when the running serve/bridge says it is alive
    (GET /livez), or ready (GET /readyz) with `ready`."""
    from arm_core.healthcheck import CHECKED, UNCHECKED, probe, running_command

    command = command or running_command()
    if command in UNCHECKED:
        print(f"arm-core {command} has no health endpoint: nothing to check")
        return 0
    if command not in CHECKED:
        print("arm-core healthcheck: name the command to check (serve or bridge)", file=sys.stderr)
        return 2
    result = probe(settings, command, ready)
    print(result.detail, file=sys.stdout if result.healthy else sys.stderr)
    return 0 if result.healthy else 1


def cmd_dev(settings: Settings) -> int:
    from arm_core.devtools.stack import run

    settings.require_safe_exposure()  # dev serves the API (retry included) as well
    return run(settings)


COMMANDS: dict[str, tuple[str, Callable[[Settings], int]]] = {
    "migrate": ("apply migrations and functions to DATABASE_URL", cmd_migrate),
    "serve": ("HTTP API on HTTP_HOST:HTTP_PORT, plus the bridge when NATS_ENABLED=true", cmd_serve),
    "bridge": ("the NATS bridge alone, health on HTTP_HOST:BRIDGE_HEALTH_PORT", cmd_bridge),
    "reference": ("reference recognition services for demos and tests", cmd_reference),
    "dev": ("the whole stack on embedded PostgreSQL and NATS, with demo uploads", cmd_dev),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="arm-core",
        description="arm-core recognition job exchange. Configuration is read from the "
        "environment (see docs/configuration.md).",
    )
    parser.add_argument("--version", action="version", version=f"arm-core {installed()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _) in COMMANDS.items():
        sub.add_parser(name, help=help_text, description=help_text)
    check = sub.add_parser(
        "healthcheck",
        help="exit 0 when the running serve or bridge is alive (the image's HEALTHCHECK)",
        description="GET the /livez of the running `arm-core serve` (HTTP_PORT) or "
        "`arm-core bridge` (BRIDGE_HEALTH_PORT): exit 0 when it answers 200 (its loops "
        "run), 1 when not (restart it). Without an argument, the command is read from "
        "PID 1 (the container's arm-core).",
    )
    check.add_argument("target", nargs="?", choices=["serve", "bridge"])
    back = sub.add_parser(
        "rollback",
        help="roll DATABASE_URL's schema back to before MIGRATION (docs/upgrading.md)",
        description="Roll back migration MIGRATION (an id of db/migrations, e.g. "
        "0013_time_ordered_ids) and every later one, each with its .rollback.sql, under "
        "migrate's lock; then run the previous version's `arm-core migrate`.",
    )
    back.add_argument("migration")
    check.add_argument(
        "--ready",
        action="store_true",
        help="ask /readyz instead: the database, NATS, the LISTEN session, not stopping",
    )
    args = parser.parse_args(argv)

    try:
        settings = Settings.from_env()  # its messages quote no secret
    except ConfigError as exc:
        print(f"arm-core: configuration error: {escape(exc)}", file=sys.stderr)
        return 2
    # Every configured secret is kept out of every log line and message from here on,
    # whatever a driver puts in its error.
    redact = Redactor(settings.secrets())
    if args.command == "healthcheck":  # no logging: one line on stdout or stderr
        return cmd_healthcheck(settings, args.target, args.ready)
    setup_logging(settings.debug, redact, settings.log_format)  # LOG_FORMAT=text|json
    try:
        if args.command == "rollback":
            return cmd_rollback(settings, args.migration)
        return COMMANDS[args.command][1](settings)
    except ConfigError as exc:
        print(f"arm-core: configuration error: {escape(redact(str(exc)))}", file=sys.stderr)
        return 2
    except DatabaseError as exc:
        print(f"arm-core: {escape(redact(str(exc)))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception:
        # A port in use, a bug: the traceback goes through the log, redacted.
        log.critical("arm-core %s failed", args.command, exc_info=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
