"""The publisher's wake-up (docs/behaviour.md#wake-up): an upload into an empty queue
sends one NOTIFY; one into a queue that already holds a job sends none, so concurrent
uploads do not commit one at a time on PostgreSQL's notify lock. Uploads go in as the
uploader's login (INSERT only: the trigger reads the queue with its owner's rights).

Absence is shown without waiting: after the upload under test, the test sends a marker
NOTIFY of its own on the same channel; notifications of different transactions arrive
in commit order, so everything the upload sent is read before the marker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from arm_core.devtools.testbed.sql import (
    UPLOADER_LOGIN,
    as_login,
    dict_conn,
    publish,
    upload,
    upload_many,
)

pytestmark = pytest.mark.integration

CHANNEL = "arm_recognition_job_queued"


def notified_since(listener: psycopg.Connection[Any], db_url: str) -> list[str]:
    """The payloads of the notifications that arrived since the last call, up to a
    marker sent now."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, 'marker')", (CHANNEL,))
    payloads: list[str] = []
    for notify in listener.notifies(timeout=10):
        if notify.payload == "marker":
            return payloads
        payloads.append(notify.payload)
    raise AssertionError("the marker never arrived")


@pytest.fixture
def listener(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield conn


def test_an_upload_into_an_empty_queue_notifies_once_one_into_a_waiting_queue_not(
    db_url: str, listener: psycopg.Connection[Any]
) -> None:
    uploader = as_login(db_url, UPLOADER_LOGIN)
    assert notified_since(listener, db_url) == []
    with dict_conn(uploader) as conn:
        upload(conn)  # the queue was empty: the publisher must hear of it
    assert notified_since(listener, db_url) == [""]
    with dict_conn(uploader) as conn:
        upload(conn)  # one is waiting: the publisher was woken for it already
        upload(conn, "PDF")
    assert notified_since(listener, db_url) == []
    with dict_conn(db_url) as conn:
        publish(conn)  # publishing and dead-lettering queue nothing: no wake-up
        conn.execute("SELECT * FROM arm.dead_letter_unacked('0 seconds', 0)")
        assert notified_since(listener, db_url) == []
        upload(conn)  # the publisher took them all: the queue is empty again
    assert notified_since(listener, db_url) == [""]


def test_a_batch_into_an_empty_queue_is_one_notification(
    db_url: str, listener: psycopg.Connection[Any]
) -> None:
    with dict_conn(db_url) as conn:
        upload_many(conn, 500, mixed=True)
    assert notified_since(listener, db_url) == [""]
    with dict_conn(db_url) as conn:
        upload_many(conn, 500)
    assert notified_since(listener, db_url) == []
