"""The `arm-core` console script: migrate, serve, bridge, dev."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from arm_core.config import ConfigError, Settings
from arm_core.db import DatabaseError
from arm_core.logs import setup_logging

log = logging.getLogger("arm_core")


def cmd_migrate(settings: Settings) -> int:
    from arm_core.migrate import migrate

    report = migrate(settings.require_database_url(), settings)
    applied = ", ".join(report.applied_migrations) or "none pending"
    print(f"migrations: {applied}; functions: {len(report.function_files)} files applied")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[Settings], int]]] = {
    "migrate": ("apply migrations and functions to DATABASE_URL", cmd_migrate),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="arm-core",
        description="arm-core recognition job exchange. Configuration is read from the "
        "environment (see README: Configuration).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _) in COMMANDS.items():
        sub.add_parser(name, help=help_text, description=help_text)
    args = parser.parse_args(argv)

    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"arm-core: configuration error: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.debug)
    try:
        return COMMANDS[args.command][1](settings)
    except ConfigError as exc:
        print(f"arm-core: configuration error: {exc}", file=sys.stderr)
        return 2
    except DatabaseError as exc:
        print(f"arm-core: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
