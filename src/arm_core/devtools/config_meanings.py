"""What each environment variable means, for docs/configuration.md: the one line of
Markdown the page shows beside each variable's name and default.

arm_core.devtools.config_doc writes the page from these and the settings' own fields;
it refuses a variable declared without a meaning here, and a meaning of a variable
nothing declares.
"""

from __future__ import annotations

from arm_core.access import LEVELS
from arm_core.config import Settings
from arm_core.config_bridge import POOL_RESERVE, PUBLISH_CONFIRM_SECONDS
from arm_core.devtools.reference import FAIL_ONCE, MARKERS, MODES, SCAN, TABULAR

# The meaning of each variable, one line of Markdown (the default comes from the field).
MEANINGS: dict[str, str] = {
    # Settings
    "DATABASE_URL": "`postgresql://user:pass@host:port/db` (required by `migrate`, "
    "`serve` and `bridge`; `dev` runs its own, `reference` and `healthcheck` read none); "
    "over the network add `?sslmode=verify-full&sslrootcert=/path/ca.crt` (and "
    "`sslcert`, `sslkey` where the server asks for client certificates): "
    "[Encryption in transit](security.md#encryption-in-transit)",
    "DATABASE_LISTEN_URL": "the URL of the bridge's LISTEN session (of `serve` with "
    "`NATS_ENABLED=true` and of `bridge`), which wakes the publisher on a `NOTIFY`: a "
    "session of its own, so direct to PostgreSQL when "
    "`DATABASE_URL` goes through a transaction pooler; checked as `DATABASE_URL`. Unset: "
    "`DATABASE_URL`. While it is down `/readyz` says `listen` and jobs go out at each "
    "`OUTBOX_POLL_SECONDS` poll: [Through PgBouncer](dbas.md#through-pgbouncer)",
    "DATABASE_POOLER": "what `DATABASE_URL` goes through: `none` (PostgreSQL itself, or "
    "a pooler in session mode, the same to arm-core) · `transaction` (PgBouncer's "
    "`pool_mode = transaction`, a server session per transaction): the pool's connections "
    "prepare no statement (psycopg's `prepare_threshold=None`) and send no startup option, "
    "so `DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS` does not reach them (the pooler's "
    "`idle_transaction_timeout` does that) and options in `DATABASE_URL` or `PGOPTIONS` "
    "stop the process at start; `DATABASE_LISTEN_URL` is required (not the same URL); "
    "`migrate` and `rollback` refuse to run (exit 2): run them direct. Said, not "
    "detected: a pooler does not tell its clients it is there. `statement` (cannot work) "
    "and `session` (leave it `none`) are refused: "
    "[Through PgBouncer](dbas.md#through-pgbouncer)",
    "DATABASE_POOL_TIMEOUT_SECONDS": "how long a request waits for a database connection "
    "before 503",
    "DATABASE_POOL_MAX_SIZE": "the most connections the process's pool opens, shared by "
    "the API's requests, `/healthcheck`, `/metrics` and the bridge's loops. Unset: with "
    "`NATS_ENABLED=true`, `OUTBOX_PUBLISHERS + INBOX_WORKERS + 1 + "
    f"{POOL_RESERVE}` (one connection per publisher and per inbox worker, one for the "
    f"schedule runner, {POOL_RESERVE} for the API, health checks and scrapes), which is "
    f"{Settings().pool_max_size()} with the defaults; with `NATS_ENABLED=false`, "
    f"{Settings(nats_enabled=False).pool_max_size()}. Not from the pool: the bridge's "
    "LISTEN connection and `arm-core migrate`'s, one each. A value below the bridge's "
    "loops plus 1 stops the process at start (exit 2). A request that finds every "
    "connection in use for `DATABASE_POOL_TIMEOUT_SECONDS` gets `503 "
    "DATABASE_POOL_EXHAUSTED` (not an outage: [Logs](logs-and-metrics.md#logs)). Every "
    "process opens up to this "
    "many sessions plus its LISTEN one: keep their sum under the server's "
    "`max_connections`",
    "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS": "every session the processes open (the "
    "pool's — not through a transaction pooler: `DATABASE_POOLER` —, the bridge's LISTEN "
    "connection, `arm-core migrate`'s) sets PostgreSQL's "
    "`idle_in_transaction_session_timeout` to this, so the server ends a session left "
    "idle inside a transaction that long (a process whose network path to PostgreSQL went "
    "silent mid-transaction no longer holds its snapshot and row locks for hours); above "
    "the publisher's longest wait inside a transaction, NATS's confirmation "
    f"({PUBLISH_CONFIRM_SECONDS:g} s), or the process stops at start (exit 2). `0`: "
    "the server's setting. A `DATABASE_URL` whose `options` set it (`options=-c "
    "idle_in_transaction_session_timeout=…`) wins; its other options are kept. See also "
    "the server's TCP keepalives: [For DBAs](dbas.md#connections-and-dead-clients)",
    "NATS_URL": "NATS server URL(s), comma-separated (every node of a cluster: "
    "[On a NATS cluster](not-losing-answers.md#on-a-nats-cluster))",
    "NATS_ENABLED": "start the bridge's tasks (publisher, inbox, schedule) in `serve`",
    "DEBUG": "debug logs",
    "LOG_FORMAT": "`text` (key=value lines for people) or `json` (one JSON object a line, "
    "for Loki/ELK); see [Logs](logs-and-metrics.md#logs)",
    "OPENBAO__NATS__NATS_SEED": "a user nkey seed (`SU…`): alone, nkey auth; with "
    "`OPENBAO__NATS__NATS_JWT`, JWT auth; both empty: no credentials (checked at start, "
    "see above)",
    "OPENBAO__NATS__NATS_JWT": "the user JWT issued to the seed's key, for JWT auth; needs "
    "`OPENBAO__NATS__NATS_SEED` (checked at start, see above)",
    "OUTBOX_POLL_SECONDS": "publisher poll period (NOTIFY wakes it sooner)",
    "OUTBOX_BATCH_SIZE": "jobs per publish transaction",
    "OUTBOX_PUBLISHERS": "publish batches in flight at once per process (one claims while "
    "another waits for its confirmation)",
    "ACK_TIMEOUT_SECONDS": "republish after this long without an ack",
    "OUTBOX_MAX_REPUBLISH": "republishes before `dlq`",
    "PACING": "how many jobs of a pipeline its service holds at once (docs/pacing.md): "
    "`auto` adapts the limit to the service's answers between the pipeline's MIN and MAX "
    "· `fixed`: the pipeline's MAX · `off`: every queued job published at once",
    "TABULAR_MIN_IN_FLIGHT": "the floor of the tabular pipeline's in-flight limit (`auto`): "
    "where it starts, and where it falls when the service stops answering",
    "TABULAR_MAX_IN_FLIGHT": "the ceiling of the tabular pipeline's in-flight limit (`auto`); "
    "the limit itself with `fixed`; at least its MIN",
    "IMAGE_MIN_IN_FLIGHT": "as TABULAR_MIN_IN_FLIGHT, for the image pipeline",
    "IMAGE_MAX_IN_FLIGHT": "as TABULAR_MAX_IN_FLIGHT, for the image pipeline",
    "TIMEOUT_SWEEP_SECONDS": "sweep period; when set, written to `arm.periodic_task` once "
    "the bridge reaches the database (otherwise a DBA's value stands)",
    "SCHEDULE_TICK_SECONDS": "how often a bridge asks the database what is due",
    "TABULAR_REPLY_TIMEOUT_SECONDS": "a tabular job's `reply_deadline = publish time + this`",
    "IMAGE_REPLY_TIMEOUT_SECONDS": "an image job's `reply_deadline = publish time + this`",
    "DEFAULT_MAX_ATTEMPTS": "`max_attempts` of new uploads; when set, `arm-core migrate` "
    "writes it to `arm.setting` (otherwise the stored value, 3 at first, stands)",
    "HTTP_HOST": "API listen address (and of the bridge's health port); off loopback, "
    "`serve` needs `AUTH_MODE` `token` or `header`, or `AUTH_ALLOW_ANONYMOUS=true`",
    "HTTP_PORT": "API port of `arm-core serve`",
    "BRIDGE_HEALTH_PORT": "health port of `arm-core bridge`",
    "TABULAR_REQUEST_SUBJECT": "request subject of tabular jobs",
    "IMAGE_REQUEST_SUBJECT": "request subject of image jobs",
    "RESULT_SUBJECT": "inbox subject (acks and results)",
    "NATS_QUEUE_GROUP": "inbox queue group (and, with `RESULTS_STREAM`, the durable "
    "consumer's name)",
    "INBOX_MAX_PAYLOAD_BYTES": "larger envelopes are dropped (logged)",
    "INBOX_BUFFER_SIZE": "envelopes the inbox's buffers hold, at most, while a worker is "
    "behind or the database is away; at least `INBOX_WORKERS` "
    "([The inbox buffer](behaviour.md#the-inbox-buffer))",
    "INBOX_BUFFER_BYTES": "the bytes those envelopes came as, at most: the bound on what "
    "answers take in memory; at least `INBOX_WORKERS` × `INBOX_MAX_PAYLOAD_BYTES` "
    "([The inbox buffer](behaviour.md#the-inbox-buffer))",
    "INBOX_WORKERS": "inbox workers, each applying its own batches on its own connection; "
    "a job's envelopes always go to the same worker (order per job holds) and each has its "
    "share of `INBOX_BUFFER_SIZE` and `INBOX_BUFFER_BYTES`",
    "INBOX_BATCH_SIZE": "most envelopes applied in one transaction",
    "OUTBOX_STUCK_SECONDS": "oldest job ready to publish (not held back by pacing) older "
    "than this (NATS up) → health `degraded`, `outbox: stuck: …`",
    "RETRY_BATCH_MAX": "most file ids in one batch retry",
    "HTTP_MAX_BODY_BYTES": "larger request bodies get 413",
    "HTTP_HEADER_TIMEOUT_SECONDS": "a connection must deliver a complete request line and "
    "headers within this of its opening or of the answer to its previous request; else it "
    "is closed without an answer (aiohttp's `keepalive_timeout`, which also closes a "
    "keep-alive connection left idle that long; `serve` and the `bridge` health port)",
    "HTTP_BODY_TIMEOUT_SECONDS": "a handler that reads a body must have it within this; "
    "else a JSON `408` and the connection is closed. A body no handler reads is thrown away "
    "after the answer for at most this long (aiohttp's `lingering_time`)",
    "AUTH_ALLOW_ANONYMOUS": "`true`: `serve` may run `AUTH_MODE=none` on a non-loopback "
    "`HTTP_HOST` (anyone who reaches it may retry, audited as `anonymous`)",
    "AUTH_MODE": "`none`, `token` (`API_TOKENS`) or `header` (`AUTH_HEADER`): who a caller "
    "is (the retry audit names it) and which [access levels](security.md#access-levels) it "
    "holds; `none`: everyone holds every level",
    "API_TOKENS": "`actor:level=token,actor2:level=token2` for `AUTH_MODE=token`: level "
    f"{', '.join(f'`{level}`' for level in LEVELS)}, tokens of 16+ characters, no token "
    "twice. An entry without `:level` holds every level (logged at start, "
    "`action=deprecated`) until 2.0, which refuses it "
    "([Access levels](security.md#access-levels))",
    "AUTH_HEADER": "identity header set by an authenticating proxy, for `AUTH_MODE=header` "
    "(only behind such a proxy: anyone reaching the port directly can claim any identity)",
    "AUTH_GROUPS_HEADER": "`AUTH_MODE=header` only: the header in which the proxy lists the "
    "caller's groups, comma-separated (oauth2-proxy: `X-Forwarded-Groups`); set, a caller's "
    "groups give its levels and a caller in none of the groups below gets 403; empty: every "
    "identified caller holds every level. Needs at least one of the group lists, and must "
    "differ from `AUTH_HEADER` ([Access levels](security.md#access-levels))",
    "AUTH_OPERATOR_GROUPS": "groups (comma-separated) whose members hold `operator`: read "
    "and retry; needs `AUTH_GROUPS_HEADER`",
    "AUTH_VIEWER_GROUPS": "groups (comma-separated) whose members hold `viewer`: read only; "
    "needs `AUTH_GROUPS_HEADER`",
    "AUTH_METRICS_GROUPS": "groups (comma-separated) whose members hold `metrics`: `GET "
    "/metrics` only; needs `AUTH_GROUPS_HEADER`",
    "METRICS_AUTH": "what `GET /metrics` of `serve` asks: `level`, a caller of level "
    "`metrics` (anyone with `AUTH_MODE=none`); `any`, any caller the API accepts; `none`, "
    "no credentials (a scrape on a private network). The probes never ask, nor does the "
    "bridge's health port",
    "RESULTS_STREAM": "the name of a JetStream stream that captures `RESULT_SUBJECT`; the "
    "core consumes it through one durable consumer named `NATS_QUEUE_GROUP` (see "
    "[The results stream](not-losing-answers.md#the-results-stream)). Needs a server with "
    "JetStream: without it the process exits 2 naming `RESULTS_STREAM`. Empty: off",
    "RESULTS_STREAM_REPLICAS": "replicas (1–5) of the stream the core creates",
    "RESULTS_STREAM_MAX_AGE_SECONDS": "the stream removes a message older than this, "
    "applied or not (the default is 7 days; by then its job has long reached its reply "
    "deadline)",
    "RESULTS_STREAM_MAX_BYTES": "the stream's byte limit, per replica on each node (at "
    "least 1 MiB; the default is 1 GiB); when full, the stream refuses new answers "
    "([the stream's bounds](not-losing-answers.md#the-streams-bounds)). The server "
    "reserves it from its `max_file_store` ([Capacity](capacity.md#the-results-stream))",
    "RESULTS_STREAM_ACK_WAIT_SECONDS": "how long the stream waits for a bridge to settle an "
    "answer it delivered before it delivers it to any bridge again (an answer waiting on "
    "its job's publish is kept meanwhile): what a bridge that died or was cut off held "
    "comes back after this; at least 1, at most `ACK_TIMEOUT_SECONDS` (else exit 2)",
    "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS": "the stream drops a message whose "
    "`Nats-Msg-Id` it stored within this (0.1 s or more, at most the maximum age); must be "
    "shorter than `ACK_TIMEOUT_SECONDS` (else exit 2), so that a service's ack to a "
    "republished request is stored ([For service teams](service-teams.md#for-service-teams))",
    "RESULTS_STREAM_REPLAY_SECONDS": "with `RESULTS_STREAM`, each bridge also receives the "
    "answers by core NATS and keeps those of the last this many seconds in memory; when the "
    "stream elects a leader it applies them again, so that what services published with "
    "core NATS while the stream had none is not lost (duplicates are ignored; "
    "[Not losing answers](not-losing-answers.md#on-a-nats-cluster)); `0`: off",
    "NATS_TLS_CA_FILE": "PEM file of the CA(s) that signed the NATS servers' certificates "
    "(a private CA); empty: the system's CAs. Setting any `NATS_TLS_*` (or a `tls://` URL) "
    "makes every NATS connection verify the server's certificate and name, TLS 1.2 or later",
    "NATS_TLS_CERT_FILE": "PEM client certificate (with its chain) for servers that verify "
    "clients (mutual TLS); needs `NATS_TLS_KEY_FILE`",
    "NATS_TLS_KEY_FILE": "PEM private key of `NATS_TLS_CERT_FILE`, unencrypted, in a file "
    "only this process's user may read",
    "NATS_TLS_HANDSHAKE_FIRST": "`true`: the TLS handshake comes before the server's "
    "first message, so nothing is ever sent in clear, whatever answers at the address (the "
    "servers need `tls { handshake_first: true }`, nats-server 2.10.4 or later). `false`: "
    "TLS when the server announces it requires TLS, as every server with a `tls` block does",
    "HTTP_TLS_CERT_FILE": "PEM certificate (with its chain): `serve` and the bridge's health "
    "port answer HTTPS only (TLS 1.2 or later); empty: plain HTTP, for a TLS-terminating "
    "proxy in front",
    "HTTP_TLS_KEY_FILE": "PEM private key of `HTTP_TLS_CERT_FILE`, unencrypted",
    "SERVICE_RESTART_LIMIT": "a loop of the bridge (publisher, an inbox worker, the "
    "listener, the schedule, the results stream's fetch or replay) that raises what it does "
    "not handle is logged (`action=service_crashed`) and restarted; one more crash than "
    "this within `SERVICE_RESTART_WINDOW_SECONDS` stops the process as SIGTERM would "
    "(draining) with exit code 1, for its supervisor to start a fresh one",
    "SERVICE_RESTART_WINDOW_SECONDS": "the window of `SERVICE_RESTART_LIMIT`",
    "LIVENESS_STALL_SECONDS": "`GET /livez` (and so the image's `HEALTHCHECK`) fails when a "
    "loop of the bridge has not come round for this long: it is stuck, and a restart helps; "
    "more than twice `DATABASE_POOL_TIMEOUT_SECONDS` (a loop waits that long for a "
    "connection while the database is away, which is no stall)",
    # ReferenceConfig
    "REFERENCE_MODE": f"how the services answer: {' · '.join(f'`{m}`' for m in MODES)}; "
    f"{', '.join(f'`{marker}`' for marker, _ in MARKERS)} in a file's name overrides it for "
    f"that file ({', '.join(f'`{mode}`' for _, mode in MARKERS)}); `{FAIL_ONCE}` fails its "
    "first attempt only",
    "REFERENCE_DELAY_SECONDS": 'between the ack and the result ("reading S3, recognising"): '
    "a worker's time per file",
    "REFERENCE_WORKERS": "files worked on at once, the service's capacity; the others wait "
    "in its own queue (unset: every file at once)",
    "REFERENCE_ACK": "`receipt`: acks a request when it arrives, as the contract asks · "
    "`start`: when a worker starts on it, as a pull-based pool does (with REFERENCE_WORKERS)",
    "REFERENCE_FAIL_CODE": "`error.code` in mode `fail` and for `[fail]` files (a code of "
    "the result schema)",
    "REFERENCE_RESULTS_DIR": "where the `result.json` files go: the local stand-in for the "
    "results bucket",
    "REFERENCE_RESULTS_BUCKET": "the bucket named in each result's `result_s3`",
    "REFERENCE_PENDING_MAX": "answers kept while NATS is unreachable; when full the oldest "
    "is dropped (a `WARNING`, `action=ref_pending_drop`, counted; see "
    "[For service teams](service-teams.md#for-service-teams))",
    "REFERENCE_PUBLISH": "`auto`: answers through JetStream publish (waiting for the "
    "PubAck) where a stream captures the result subject, else core NATS · `core`: always "
    "core NATS, as a service that has not adopted JetStream publish (`make chaos` measures "
    "what it loses)",
}

# The default of a variable whose field holds None because its default is derived from
# other settings: how the page shows it.
DERIVED_DEFAULTS: dict[str, str] = {
    "RESULTS_STREAM_ACK_WAIT_SECONDS": "30",
    "DATABASE_POOL_MAX_SIZE": f"{Settings().pool_max_size()} (computed)",
    "RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS": "a third of `ACK_TIMEOUT_SECONDS` (10 with "
    "its default), at most 120 and the maximum age, at least 0.1",
}

# Variables read outside the dataclasses: name → (default, meaning). Each must still be
# read somewhere in the package (checked by arm_core.devtools.config_doc.other_variables).
OTHER_VARIABLES: dict[str, tuple[str, str]] = {
    "REFERENCE_SERVICES": (
        f"`{TABULAR},{SCAN}`",
        "which reference services `arm-core reference` (and `dev`) runs, comma-separated",
    ),
    "ARM_DEV_DIR": (
        "`.dev`",
        "where `arm-core dev` keeps its PostgreSQL and nats-server, their logs and its own, "
        "and the result files",
    ),
    "PG_BINDIR": (
        "—",
        "the PostgreSQL server binaries (`initdb`, `pg_ctl`, `postgres`) of the embedded "
        "PostgreSQL of `arm-core dev`, the tests and the benchmarks; unset: `pg_config "
        "--bindir`, then the newest `/usr/lib/postgresql/*/bin`",
    ),
}
