"""docs/logs-and-metrics.md's table of log actions: every `action` a log line of arm-core
can carry, the modules that write it, and what it means.

The names come from the code itself (actions_in_code(): the `action` of every log call's
fields, read from the source's syntax tree), the meanings from ACTIONS below; the test
fails when the two disagree, so a new action cannot ship undocumented and a documented
one cannot outlive its code.

    python -m arm_core.devtools.actions_doc --write   # rewrite the table
    python -m arm_core.devtools.actions_doc --check   # exit 1 with a diff when stale
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

from arm_core.devtools import generated

DOC_PATH = generated.CHECKOUT / "docs" / "logs-and-metrics.md"
REGENERATE = "python -m arm_core.devtools.actions_doc --write"
BEGIN = (
    f"<!-- The action table is generated from the code by `{REGENERATE}`: "
    "edit ACTIONS there, not here. -->"
)
END = "<!-- End of the generated action table. -->"

# The code whose log lines the table covers: the runtime package and the reference
# service (`arm-core reference`: the service and its sender), not the other developer tools.
SOURCES = (
    "bridge",
    "http",
    "src/arm_core",
    "src/arm_core/devtools/reference.py",
    "src/arm_core/devtools/reference_sender.py",
)

# Helpers that put their argument at this position into a line's `action` field.
CARRIERS = {"_job": 0, "_envelope": 1, "batch_failed": 1, "Episode": 0}
# The publisher's _send(messages, action) does too; the reference's _send does not.
CARRIERS_IN = {"publisher": {"_send": 1}}

# What each action means, in the table's order: the bridge's flow first, then its
# connections and services, the processes, the database, the reference service.
ACTIONS: dict[str, str] = {
    "publish": "jobs published (a batch, INFO; each job at DEBUG), a failed batch (ERROR: "
    "the jobs stay queued), NATS gone and back for the publisher, nobody listening on a "
    "request subject when a probe of a silent service went out (`reason=no_responders`: "
    "the probe stays queued) and a service listening again",
    "republish": "unacked jobs sent again with the same `Nats-Msg-Id`, or a failed republish",
    "publish_cycle": "a publisher cycle failed before sending (the database, usually); "
    "the next one tries again",
    "dlq": "a job dead-lettered: no ack after `OUTBOX_MAX_REPUBLISH` republishes, or a "
    "request too large for the server's `max_payload` (`reason=REQUEST_TOO_LARGE`)",
    "ack": "an ack applied or ignored (`outcome`, `reason`: duplicate, already_final, "
    "unknown_job, …)",
    "result": "a result applied or ignored, as for `ack`",
    "inbox_batch": "answers applied in one transaction, with their outcomes",
    "inbox_split": "a batch failed as a whole and is applied one by one",
    "inbox_hold": "the database is unreachable: the inbox holds the answers and tries again",
    "inbox_drop": "a message dropped before the database saw it (`reason`: not_json, "
    "schema, schema_version_unsupported, too_large, missing_msg_id, …)",
    "inbox_drops": "answers lost in a burst (`reason`: buffer_full, shutdown, "
    "slow_consumer): one line per burst, with the count",
    "inbox_sanitize": "an answer made storable (NUL, NaN or lone surrogates replaced)",
    "inbox_truncate": "an answer's over-long fields cut to the caps before storing",
    "inbox_ack_without_msg_id": "an ack without `Nats-Msg-Id`, taken under the id the "
    "contract gives it",
    "inbox_redelivered": "answers the results stream delivered again (handed back by a "
    "bridge that lost its database)",
    "stream_intake": "this bridge stops (WARNING) or resumes (INFO) taking answers from the "
    "results stream as its database goes and comes back",
    "stream_hand_back": "answers handed back to the results stream for another bridge",
    "stream_replay": "the stream elected a leader: the last seconds' core-NATS answers "
    "applied again",
    "stream_ack_failed": "a message of the results stream could not be settled: it comes again",
    "stream_created": "the results stream created, with its settings",
    "stream_found": "the results stream found as configured",
    "stream_updated": "the results stream's settings changed to the configuration's",
    "stream_differs": "the results stream differs from the configuration in what arm-core "
    "does not change",
    "stream_consumers": "the results stream has consumers besides arm-core's: it keeps "
    "what they have not read",
    "stream_waiting": "JetStream does not answer for the stream yet; trying again",
    "stream_unavailable": "the server cannot hold the results stream: the bridge exits 2",
    "stream_replay_refused": "NATS refused the subscription the replay needs",
    "nats_connected": "connected, subscribed in the queue group (or consuming the stream)",
    "nats_subscribe_refused": "NATS refused the subscription: this bridge hears no answers",
    "nats_disconnected": "the connection to NATS lost",
    "nats_reconnected": "connected to NATS again",
    "nats_reconnect": "NATS did not answer a PING in time: connecting again",
    "nats_lame_duck": "the NATS server is going away (lame-duck mode)",
    "nats_error": "an error nats-py reported (each kind at most every 30 s)",
    "nats_drained": "left the queue group at a stop; applying what is held",
    "nats_drain_failed": "the queue group could not be left cleanly at a stop",
    "listen": "the LISTEN connection that wakes the publisher lost or back (polling carries on)",
    "schedule": "a periodic task ran or failed; a tick, fold, wait record or heartbeat failed",
    "service_crashed": "a loop raised: logged with its traceback, restarted after a backoff",
    "service_restarted": "a crashed loop runs again",
    "service_failed": "a loop crashed past `SERVICE_RESTART_LIMIT`: the process stops, exit 1",
    "cancel_late": "a task still running after being cancelled at a stop",
    "bridge": "`arm-core bridge` started: its health port",
    "bridge_off": "`NATS_ENABLED=false`: this process runs no bridge",
    "bridge_stopped": "the bridge stopped, with the answers it dropped (`count`)",
    "bridge_forget_failed": "at a stop, the bridge's row of `arm.bridge_instance` could "
    "not be removed (it stays, and shows silent)",
    "serve": "`arm-core serve` started, or warns of plain HTTP or anonymous access off loopback",
    "deprecated": "at start (WARNING, once): a setting this release still takes and the "
    "next refuses — `API_TOKENS` entries without a level, naming their actors, never a token",
    "http": "a request answered 503: the database unavailable or the pool exhausted (DEBUG)",
    "http_timeout": "a request body not received within `HTTP_BODY_TIMEOUT_SECONDS`: 408",
    "http_bad_request": "a request aiohttp could not parse: 400",
    "metrics": "`/metrics` without the database's gauges (it could not read them), or "
    "without the expiry of a certificate file `DATABASE_URL` names (unreadable at start)",
    "migrate": "`arm-core migrate` or `rollback`: a migration applied or rolled back, "
    "roles made, function files applied",
    "db_conflict": "a call PostgreSQL rolled back for a concurrent transaction (a deadlock), "
    "sent again; `count` is the try",
    "db_outage": "the database unreachable: `state` started, ongoing (every 30 s), ended",
    "db_pool_exhausted": "every pool connection in use past `DATABASE_POOL_TIMEOUT_SECONDS`: "
    "`state` started, ongoing, ended",
    "ref_start": "the reference service started",
    "ref_stream": "how the reference answers: JetStream publish or core NATS",
    "ref_refuse": "a request against the contract, answered `SCHEMA_MISMATCH`",
    "ref_drop": "the reference failed on a request: no answer",
    "ref_waiting": "the reference's answers wait for NATS",
    "ref_resumed": "NATS back: the reference's answers flow again",
    "ref_pending_drop": "the reference dropped its oldest waiting answers "
    "(`REFERENCE_PENDING_MAX`)",
    "ref_unsent": "the reference stopped with answers not sent",
}


def _files() -> Iterator[Path]:
    for source in SOURCES:
        path = generated.CHECKOUT / source
        yield from [path] if path.is_file() else sorted(path.glob("*.py"))


def _constants(node: ast.expr | None) -> Iterator[str]:
    """The strings `node` can be: a constant, or either branch of `a if c else b`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _constants(node.body)
        yield from _constants(node.orelse)


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def actions_in_source(source: str, module: str) -> set[str]:
    """The actions the log calls of `source` (the module `module`) can carry: the value
    of an `action` key or keyword, an assignment to `action`, or the argument a CARRIER
    puts into the field."""
    carriers = {**CARRIERS, **CARRIERS_IN.get(module, {})}
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        values: list[ast.expr] = []
        if isinstance(node, ast.Dict):
            values += [
                v
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value == "action"
            ]
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == "action" for t in node.targets):
                values.append(node.value)
        elif isinstance(node, ast.Call) and _called(node) != "add_argument":
            values += [k.value for k in node.keywords if k.arg == "action"]
            index = carriers.get(_called(node) or "")
            if index is not None and index < len(node.args):
                values.append(node.args[index])
        for value in values:
            found.update(_constants(value))
    return found


def actions_in_code() -> dict[str, set[str]]:
    """Every action a log line of SOURCES can carry → the modules that write it."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in _files():
        for action in actions_in_source(path.read_text(encoding="utf-8"), path.stem):
            found[action].add(path.stem)
    return dict(found)


def render_table(found: dict[str, set[str]]) -> str:
    lines = ["| `action` | written by | what happened |", "| --- | --- | --- |"]
    for action, meaning in ACTIONS.items():
        modules = ", ".join(sorted(found.get(action, set())))
        lines.append(f"| `{action}` | {modules} | {meaning} |")
    return "\n".join(lines) + "\n"


def render(page: str) -> str:
    """`page` with the table between its markers written from the code and ACTIONS."""
    table = render_table(actions_in_code())
    return generated.replace_between(page, BEGIN, END, table, "docs/logs-and-metrics.md")


def main(argv: Sequence[str] | None = None) -> int:
    return generated.main(
        argv,
        prog="python -m arm_core.devtools.actions_doc",
        description="docs/logs-and-metrics.md's table of log actions, from the code.",
        path=DOC_PATH,
        render=lambda: render(DOC_PATH.read_text(encoding="utf-8")),
        source="the code's log calls",
        regenerate=REGENERATE,
    )


if __name__ == "__main__":
    sys.exit(main())
