"""What the RESULTS_STREAM tests share: the stream's name, the settings of a bridge that
consumes it, and jobs published the way the publisher leaves them (answers to come)."""

from __future__ import annotations

from typing import Any

from arm_core.config import Settings
from arm_core.devtools.testbed.sql import dict_conn, publish, upload_many
from tests.support.bridge import fast_settings

STREAM = "ARM_RESULTS"


def stream_settings(db_url: str, url: str, **more: Any) -> Settings:
    return fast_settings(db_url, url, results_stream=STREAM, **more)


def published_jobs(db_url: str, n: int) -> list[dict[str, Any]]:
    """n uploads, published (without NATS); their job and file ids, by job id."""
    with dict_conn(db_url) as conn:
        upload_many(conn, n)
        assert len(publish(conn)) == n
        return conn.execute(
            "SELECT id AS job_id, file_id FROM arm.recognition_job ORDER BY id"
        ).fetchall()
