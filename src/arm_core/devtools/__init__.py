"""Development tools, kept apart from the runtime: embedded PostgreSQL and nats-server
(`embedded_postgres`, `embedded_nats`, and `embedded`, what they share), the reference
recognition services (`reference`), the `arm-core dev` stack (`stack`), and the testbed
the tests and the benchmarks share (`testbed`).

The runtime modules (bridge, http, config, db, runtime, migrate, logs, statuses, …) never
import this package; import-linter checks that (pyproject.toml [tool.importlinter]).
Only the CLI's `dev` and `reference` commands load it, lazily.
"""
