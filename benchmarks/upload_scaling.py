"""Uploads from 1 and from 16 writers, both ways docs/dbas.md documents: the plain-SQL
upload as existing upstream code sends it — four statements in ONE transaction per file —
as a pgbench custom script (UPLOAD_SCRIPT, the ids carried from statement to statement
with `\\gset`), and the recommended one-call upload, `SELECT * FROM arm.upload_file(…)`
(FUNCTION_SCRIPT: one statement, its own transaction), both `-M extended` (bound
parameters, as a driver sends them), beside `pgbench -N -M extended` from the same client
counts, all on the same cluster in the same run.

The uploads run in a migrated database (`bench.fresh_database("uploads")`, nothing else
running in it: no bridge, so the queued jobs pile up), logged in as the upload service's
role: the login `arm_test_uploader`, member of `arm_uploader` only (arm_core.devtools.testbed.sql's
UPLOADER_LOGIN, created by ensure_logins), which may do exactly this upload and nothing
else. Every file is an XLSX `ОСВ <n>.xlsx` with a fresh object key and consolidation id.
The `-N` reference runs in its own database, initialised with `pgbench -i` at the same
scale as section 1, as the superuser. Each triple (-N, the plain-SQL uploads, the function's, at one
client count) runs twice, in the order 1, 16, 16, 1 clients, and each figure is the mean of its two
runs, so that a drift of the machine (its disk's flush time above all, with durability
on) hits both sides and both client counts alike; the notes give every run. 1 client
runs with `-j 1`, 16 with `-j 2` (2 cores).

During the 16-client runs (every side) benchmarks/waits.py samples pg_stat_activity and
reports where the backends were: running (CPU), waiting for the WAL flush of a commit
(group commit), on a lock, or on the client.

Read: each upload tps ÷ the `-N` tps at the same client count (one upload is one
transaction of four statements, three inserts into indexed tables and an update, against
`-N`'s update, select and insert), and the scaling — tps at 16 ÷ tps at 1 — of uploads
÷ that of `-N`: below 1 means the uploads gain less from more writers than PostgreSQL
itself does (a hot spot of their own: an index page, a trigger's counter row, a lock).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from arm_core.devtools.embedded_postgres import find_pg_bindir
from arm_core.devtools.testbed.sql import UPLOADER_LOGIN, ensure_logins
from benchmarks.harness import Bench, progress, scalar
from benchmarks.pgbench import run_pgbench, tps
from benchmarks.report import Report
from benchmarks.waits import SAMPLE_SECONDS, WaitSampler

SECTION = "2 uploads"
NAMES = {"N": "-N", "up": "uploads", "fn": "arm.upload_file"}
CLIENTS = ((1, 1), (16, 2))  # (clients, pgbench threads)

# docs/dbas.md "Uploading a file": the plain-SQL upload as arm_uploader, one file per
# transaction.
UPLOAD_SCRIPT = """\
-- docs/dbas.md's upload, as upstream sends it: four statements, one transaction.
BEGIN;
INSERT INTO arm.s3_object (bucket, key, bucket_role, created_by)
VALUES ('arm-ka', 'uploads/' || gen_random_uuid() || '/ОСВ.xlsx', 'uploads', 'upload-service')
RETURNING id AS obj \\gset
INSERT INTO arm.stored_file (consolidation_id, original_name, file_type, s3_object_id)
VALUES (gen_random_uuid(), 'ОСВ ' || (random() * 1000000)::int || '.xlsx', 'XLSX', :obj)
RETURNING id AS file \\gset
INSERT INTO arm.recognition_job (file_id, pipeline, attempt)
VALUES (:file, 'tabular', 1)
RETURNING id AS job \\gset
UPDATE arm.stored_file SET current_recognition_job_id = :job WHERE id = :file;
COMMIT;
"""

# docs/dbas.md "Uploading a file": the same file in one call of arm.upload_file.
FUNCTION_SCRIPT = """\
-- docs/dbas.md's recommended upload: one call, one statement, its own transaction.
SELECT * FROM arm.upload_file('arm-ka', 'uploads/' || gen_random_uuid() || '/ОСВ.xlsx',
    'ОСВ ' || (random() * 1000000)::int || '.xlsx', 'XLSX', gen_random_uuid(), 'upload-service');
"""


def upload_script(bench: Bench, name: str = "upload.sql", text: str = UPLOAD_SCRIPT) -> Path:
    """A script as a file pgbench can read (as root it runs as root: any place)."""
    path = bench.workdir / name
    path.write_text(text, encoding="utf-8")
    return path


def pgbench_base(bench: Bench, user: str) -> list[str]:
    """pgbench's path and its connection options for `user` on the bench's cluster."""
    return [
        str(find_pg_bindir() / "pgbench"),
        "-h",
        "127.0.0.1",
        "-p",
        str(bench.pg.port),
        "-U",
        user,
    ]


def pgbench_env() -> dict[str, str]:
    """The script holds Cyrillic file names: the client speaks UTF-8 whatever the locale."""
    return {**os.environ, "PGCLIENTENCODING": "UTF8"}


def run(bench: Bench, report: Report) -> None:
    s = bench.sizes
    uploads_url = bench.fresh_database("uploads")
    ensure_logins(uploads_url)
    bench.fresh_database("uploads_ref", migrated=False)
    superuser = pgbench_base(bench, bench.pg.user)
    uploader = pgbench_base(bench, UPLOADER_LOGIN.name)
    scripts = {"up": upload_script(bench), "fn": upload_script(bench, "fn.sql", FUNCTION_SCRIPT)}
    env = pgbench_env()
    run_pgbench([*superuser, "-i", "-q", "-s", str(s.pgbench_scale), "uploads_ref"], env)
    seconds = ["-T", str(s.pgbench_seconds), "-M", "extended"]
    runs: dict[tuple[str, int], list[float]] = {}
    (low, _), (high, _) = CLIENTS
    admin = bench.pg.url("postgres")
    waits = {
        "N": WaitSampler(admin, "uploads_ref"),
        "up": WaitSampler(admin, "uploads"),
        "fn": WaitSampler(admin, "uploads"),
    }
    for clients, threads in [*CLIENTS, *reversed(CLIENTS)]:  # 1, 16, 16, 1
        load = ["-c", str(clients), "-j", str(threads), *seconds]
        sampled = clients == high
        progress(f"pgbench -N -M extended, {clients} client(s)")
        with waits["N"] if sampled else contextlib.nullcontext():
            out = run_pgbench([*superuser, "-N", *load, "uploads_ref"], env)
        runs.setdefault(("N", clients), []).append(tps(out))
        for what, script in scripts.items():
            progress(f"uploads (pgbench -f {script.name} -M extended), {clients} client(s)")
            with waits[what] if sampled else contextlib.nullcontext():
                out = run_pgbench([*uploader, "-n", "-f", str(script), *load, "uploads"], env)
            runs.setdefault((what, clients), []).append(tps(out))
    measured = {key: sum(values) / len(values) for key, values in runs.items()}
    for clients, threads in CLIENTS:
        ref = f"uploads.N{clients}"
        report.add(
            ref,
            SECTION,
            f"pgbench -N -M extended, {clients} client{'s' * (clients > 1)}, -j {threads}, "
            f"scale {s.pgbench_scale}, mean of 2 × {s.pgbench_seconds} s",
            measured["N", clients],
            "tps",
            short=f"-N, {clients} client{'s' * (clients > 1)}",
        )
        report.add(
            f"uploads.up{clients}",
            SECTION,
            f"upload: 4 statements, 1 transaction (docs/dbas.md), -M extended, role "
            f"arm_uploader, {clients} client{'s' * (clients > 1)}, -j {threads}, "
            f"mean of 2 × {s.pgbench_seconds} s",
            measured["up", clients],
            "files/s",
            ref=ref,
        )
        report.add(
            f"uploads.fn{clients}",
            SECTION,
            f"upload: arm.upload_file, 1 statement (docs/dbas.md), -M extended, role "
            f"arm_uploader, {clients} client{'s' * (clients > 1)}, -j {threads}, "
            f"mean of 2 × {s.pgbench_seconds} s",
            measured["fn", clients],
            "files/s",
            ref=ref,
        )
    report.add(
        "uploads.N.scaling",
        SECTION,
        f"    pgbench -N -M extended: tps at {high} clients ÷ at {low}",
        measured["N", high] / measured["N", low],
        "×",
        digits=2,
        short=f"-N, {high} ÷ {low}",
    )
    report.add(
        "uploads.scaling",
        SECTION,
        f"    uploads: files/s at {high} clients ÷ at {low} (ratio: ÷ the scaling of -N)",
        measured["up", high] / measured["up", low],
        "×",
        ref="uploads.N.scaling",
        digits=2,
    )
    report.add(
        "uploads.fn.scaling",
        SECTION,
        f"    arm.upload_file: files/s at {high} clients ÷ at {low} (ratio: ÷ the scaling of -N)",
        measured["fn", high] / measured["fn", low],
        "×",
        ref="uploads.N.scaling",
        digits=2,
    )
    report.add(
        "uploads.waits",
        SECTION,
        f"    where the {high} clients' backends were (pg_stat_activity every "
        f"{SAMPLE_SECONDS * 1000:g} ms; WAL flush = waiting for a commit's WAL to be written "
        "and fsynced)",
        text=f"uploads: {waits['up'].describe()}; arm.upload_file: {waits['fn'].describe()}; "
        f"-N: {waits['N'].describe()}",
    )
    files = int(scalar(uploads_url, "SELECT count(*) FROM arm.stored_file"))
    each = "; ".join(
        f"{NAMES[what]} at {clients}: " + " and ".join(f"{v:,.0f}" for v in values)
        for (what, clients), values in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    )
    report.note(
        f"Uploads: {files:,} files uploaded over the eight upload runs (each an s3_object, a "
        "stored_file and a queued job), as arm_test_uploader (member of arm_uploader only). "
        f"Each run, tps in the order run (the table has their means): {each}."
    )
    bench.drop_database(uploads_url)
    bench.drop_database(bench.pg.url("uploads_ref"))
