"""Uploads as upstream makes them (docs/dbas.md, "Uploads are plain SQL"): an `arm.s3_object`
(role `uploads`), an `arm.stored_file`, an `arm.recognition_job (file_id, pipeline,
attempt)` with every other column defaulted, then `stored_file.current_recognition_job_id`.

Set-based, for bursts and paced batches: the three inserts in one statement, then the
UPDATE as a second statement of the same transaction (an UPDATE inside the same WITH
could not see the rows its sibling CTEs insert). arm_core.devtools.testbed.sql.upload_many leaves
current_recognition_job_id out; this one sets it, as docs/dbas.md says.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

_INSERT = """
WITH o AS (
    INSERT INTO arm.s3_object (bucket, key, bucket_role, created_by)
    SELECT 'arm-ka', 'uploads/' || %(tag)s || '/' || g || '/' || gen_random_uuid(),
           'uploads', 'upload-service'
    FROM generate_series(1, %(n)s) g
    RETURNING id, key
), f AS (
    INSERT INTO arm.stored_file (consolidation_id, original_name, file_type, s3_object_id)
    SELECT gen_random_uuid(),
           CASE WHEN %(mixed)s AND split_part(o.key, '/', 3)::int %% 2 = 0
                THEN 'Скан ' || split_part(o.key, '/', 3) || '.pdf'
                ELSE 'ОСВ ' || split_part(o.key, '/', 3) || '.xlsx' END,
           CASE WHEN %(mixed)s AND split_part(o.key, '/', 3)::int %% 2 = 0
                THEN 'PDF' ELSE 'XLSX' END::arm.file_type,
           o.id
    FROM o
    RETURNING id, file_type
)
INSERT INTO arm.recognition_job (file_id, pipeline, attempt)
SELECT f.id,
       CASE WHEN f.file_type IN ('XLS', 'XLSX', 'XLSB') THEN 'tabular' ELSE 'image' END
           ::arm.pipeline,
       1
FROM f
RETURNING file_id, id
"""

_SET_CURRENT = """
UPDATE arm.stored_file f
SET current_recognition_job_id = u.job_id
FROM unnest(%(file_ids)s::uuid[], %(job_ids)s::uuid[]) AS u(file_id, job_id)
WHERE f.id = u.file_id
"""


def upload_files(
    conn: psycopg.Connection[Any], n: int, tag: str = "burst", mixed: bool = True
) -> None:
    """`n` uploads in one transaction (one NOTIFY wakes the publisher at commit). With
    `mixed`, every other file is a PDF scan (image pipeline), the rest XLSX (tabular)."""
    with conn.transaction():
        rows = conn.execute(_INSERT, {"n": n, "tag": tag, "mixed": mixed}).fetchall()
        conn.execute(
            _SET_CURRENT, {"file_ids": [r[0] for r in rows], "job_ids": [r[1] for r in rows]}
        )


async def upload_files_async(
    conn: psycopg.AsyncConnection[Any], n: int, tag: str, mixed: bool = True
) -> list[uuid.UUID]:
    """The same as :func:`upload_files`, on an async connection (paced uploads); returns
    the ids of the jobs, committed."""
    async with conn.transaction():
        cur = await conn.execute(_INSERT, {"n": n, "tag": tag, "mixed": mixed})
        rows = await cur.fetchall()
        await conn.execute(
            _SET_CURRENT, {"file_ids": [r[0] for r in rows], "job_ids": [r[1] for r in rows]}
        )
    return [r[1] for r in rows]


# What the publisher does, in SQL and without NATS: its statement (unpaced), which claims
# a batch and marks it published; no request is too large here. Used to build live jobs
# for the sweep and failed files for the retry API.
PUBLISH_IN_SQL = """
SELECT count(*) FROM arm.publish_queued_jobs_v2(
    %(limit)s, make_interval(secs => %(timeout)s), make_interval(secs => %(timeout)s),
    'files.tabular_uploaded', 'files.img_uploaded', 2147483647)
"""


def publish_in_sql(
    conn: psycopg.Connection[Any], timeout_seconds: float, batch: int = 10_000
) -> int:
    """Publishes every queued job through arm.publish_queued_jobs_v2, `batch` per
    transaction, with reply deadlines `timeout_seconds` from now."""
    total = 0
    while True:
        row = conn.execute(PUBLISH_IN_SQL, {"limit": batch, "timeout": timeout_seconds}).fetchone()
        marked = int(row[0]) if row else 0
        total += marked
        if marked == 0:
            return total
