"""The upload in one call: arm.upload_file and arm.upload_files (docs/dbas.md "Uploading a
file"). They write exactly the rows the plain-SQL upload writes, through the same
triggers; bad input is refused, naming the file and the field, and nothing is written; a
batch wakes the publisher once at most."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.errors import InvalidParameterValue
from psycopg.types.json import Jsonb

from arm_core.devtools.embedded_postgres import find_pg_bindir
from arm_core.devtools.testbed.sql import (
    OWNER_LOGIN,
    UPLOADER_LOGIN,
    Conn,
    Login,
    as_login,
    dict_conn,
    scalar,
    upload,
    upload_file,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

TABLES = ("s3_object", "stored_file", "recognition_job")


def connect(db_url: str, login: Login) -> Conn:
    return dict_conn(as_login(db_url, login))


def rows_of(admin: Conn, file_id: uuid.UUID) -> dict[str, Any]:
    """A file's three rows, with what differs between any two uploads (ids, the key, the
    times) replaced by how they relate: the ids link up, the times are the transaction's."""
    file = admin.execute("SELECT * FROM arm.stored_file WHERE id = %s", (file_id,)).fetchone()
    assert file is not None
    obj = admin.execute("SELECT * FROM arm.s3_object WHERE id = %s", (file["s3_object_id"],))
    source = obj.fetchone()
    jobs = admin.execute(
        "SELECT * FROM arm.recognition_job WHERE file_id = %s", (file_id,)
    ).fetchall()
    assert source is not None and len(jobs) == 1
    [job] = jobs
    assert file["current_recognition_job_id"] == job["id"]
    assert file["created_at"] == file["updated_at"] == source["created_at"] == job["requested_at"]
    # The job's pacing lane is its file's consolidation, whichever upload wrote it.
    assert job["lane"] == file["consolidation_id"]
    ignored = {
        "id", "key", "s3_object_id", "current_recognition_job_id", "file_id", "original_name",
        "consolidation_id", "created_at", "updated_at", "requested_at", "lane",
    }  # fmt: skip
    return {
        "s3_object": {k: v for k, v in source.items() if k not in ignored},
        "stored_file": {k: v for k, v in file.items() if k not in ignored},
        "recognition_job": {k: v for k, v in job.items() if k not in ignored},
    }


def counts(admin: Conn) -> list[int]:
    return [scalar(admin, f"SELECT count(*) FROM arm.{t}") for t in TABLES]


def batch(n: int, **fields: Any) -> list[dict[str, Any]]:
    return [
        {
            "bucket": "arm-ka",
            "key": f"uploads/b/{i}.xlsx",
            "original_name": f"ОСВ {i}.xlsx",
            "file_type": "XLSX" if i % 2 else "PDF",
            "consolidation_id": str(uuid.uuid4()),
            "created_by": "upload-service",
            **fields,
        }
        for i in range(1, n + 1)
    ]


@pytest.mark.parametrize("file_type", ["XLSX", "PDF"])
def test_upload_file_writes_the_rows_of_the_plain_sql_upload(db_url: str, file_type: str) -> None:
    """As the uploader's login: the object (role uploads), the file, its queued attempt 1
    with the pipeline and max_attempts the defaults trigger gives, the file's current job."""
    with dict_conn(db_url) as admin:
        admin.execute("SELECT arm.set_setting('default_max_attempts', '4')")
        with connect(db_url, UPLOADER_LOGIN) as uploader:
            plain = upload(uploader, file_type)
            called = upload_file(uploader, file_type)
        assert rows_of(admin, called.file_id) == rows_of(admin, plain.file_id)
        row = admin.execute(
            "SELECT j.pipeline, j.max_attempts, j.status, j.attempt, f.status AS file_status, "
            "o.bucket_role, o.key, o.created_by "
            "FROM arm.stored_file f JOIN arm.recognition_job j ON j.id = %s "
            "JOIN arm.s3_object o ON o.id = f.s3_object_id WHERE f.id = %s",
            (called.job_id, called.file_id),
        ).fetchone()
    pipeline = "tabular" if file_type == "XLSX" else "image"
    assert row == {
        "pipeline": pipeline,
        "max_attempts": 4,
        "status": "queued",
        "attempt": 1,
        "file_status": "UPLOADED",
        "bucket_role": "uploads",
        "key": called.key,
        "created_by": "upload-service",
    }


def test_upload_files_writes_each_file_as_upload_file_does(db_url: str) -> None:
    files = batch(5)
    with dict_conn(db_url) as admin, connect(db_url, UPLOADER_LOGIN) as uploader:
        returned = uploader.execute(
            "SELECT * FROM arm.upload_files(%s)", (Jsonb(files),)
        ).fetchall()
        assert [r["n"] for r in returned] == [1, 2, 3, 4, 5]
        xlsx, pdf = upload_file(uploader, "XLSX"), upload_file(uploader, "PDF")
        for given, got in zip(files, returned, strict=True):
            reference = xlsx if given["file_type"] == "XLSX" else pdf
            assert rows_of(admin, got["file_id"]) == rows_of(admin, reference.file_id)
            file = admin.execute(
                "SELECT f.original_name, f.consolidation_id::text, o.key "
                "FROM arm.stored_file f JOIN arm.s3_object o ON o.id = f.s3_object_id "
                "WHERE f.id = %s AND f.current_recognition_job_id = %s",
                (got["file_id"], got["job_id"]),
            ).fetchone()
            assert file == {
                "original_name": given["original_name"],
                "consolidation_id": given["consolidation_id"],
                "key": given["key"],
            }
        assert counts(admin) == [7, 7, 7]
        # An empty batch writes nothing and returns nothing.
        assert uploader.execute("SELECT * FROM arm.upload_files('[]')").fetchall() == []


def test_a_dbas_call_behaves_the_same(db_url: str) -> None:
    """A DBA (a member of arm_owner) and the suite's superuser get the same rows."""
    with dict_conn(db_url) as admin:
        with connect(db_url, UPLOADER_LOGIN) as uploader:
            reference = rows_of(admin, upload_file(uploader).file_id)
        with connect(db_url, OWNER_LOGIN) as dba:
            assert rows_of(admin, upload_file(dba).file_id) == reference
            [row] = dba.execute("SELECT * FROM arm.upload_files(%s)", (Jsonb(batch(1)),))
            assert rows_of(admin, row["file_id"]) == reference
        assert rows_of(admin, upload_file(admin).file_id) == reference


# (fields of the third file, the error's class, the field named, what the message says)
BAD = [
    ({"key": ""}, psycopg.errors.InvalidParameterValue, "key", "key must not be empty"),
    ({"key": None}, psycopg.errors.InvalidParameterValue, "key", "key must not be empty"),
    ({"bucket": ""}, psycopg.errors.InvalidParameterValue, "bucket", "bucket must not be empty"),
    (
        {"original_name": ""},
        psycopg.errors.InvalidParameterValue,
        "original_name",
        "original_name must not be empty",
    ),
    (
        {"file_type": "DOCX"},
        psycopg.errors.InvalidParameterValue,
        "file_type",
        "file_type 'DOCX' is not a file type (XLS, XLSX, XLSB, PDF, PNG, JPG)",
    ),
    (
        {"consolidation_id": "6c1f…"},
        psycopg.errors.InvalidParameterValue,
        "consolidation_id",
        "consolidation_id '6c1f…' is not a uuid",
    ),
    (
        {"filetype": "PDF"},
        psycopg.errors.InvalidParameterValue,
        "filetype",
        "filetype is not a field of an upload",
    ),
    (
        {"key": "uploads/" + "k" * 1100},
        psycopg.errors.CheckViolation,
        None,
        "s3_object_key_length",
    ),
    (
        {"bucket_role": "results"},
        psycopg.errors.CheckViolation,
        None,
        "is a results object; a file's source must be an uploads object",
    ),
]


@pytest.mark.parametrize(("fields", "error", "column", "says"), BAD, ids=lambda x: str(x)[:30])
def test_a_bad_file_fails_the_whole_batch_naming_the_field(
    db_url: str, fields: dict[str, Any], error: type[Exception], column: str | None, says: str
) -> None:
    files = batch(4)
    files[2] = {k: v for k, v in {**files[2], **fields}.items() if v is not None}
    with dict_conn(db_url) as admin, connect(db_url, UPLOADER_LOGIN) as uploader:
        with pytest.raises(error) as refused:
            uploader.execute("SELECT * FROM arm.upload_files(%s)", (Jsonb(files),))
        message = str(refused.value)
        assert says in message
        if column is not None:
            assert "file 3 of 4" in message
            assert refused.value.diag.column_name == column  # type: ignore[attr-defined]
        assert counts(admin) == [0, 0, 0]


@pytest.mark.parametrize(
    ("args", "error", "column", "says"),
    [
        (("", "k", "a.xlsx", "XLSX", None), InvalidParameterValue, "bucket", "bucket must not"),
        (("arm-ka", "", "a.xlsx", "XLSX", None), InvalidParameterValue, "key", "key must not"),
        (("arm-ka", "k", "", "XLSX", None), InvalidParameterValue, "original_name", "name must"),
        (("arm-ka", "k", "a.xlsx", None, None), InvalidParameterValue, "file_type", "be given"),
        (("arm-ka", "k", "a.docx", "DOCX", None), InvalidParameterValue, "file_type", "'DOCX'"),
        (("arm-ka", "k", "a.xlsx", "XLSX", "s3"), InvalidParameterValue, "bucket_role", "'s3'"),
        (("arm-ka", "k", "a.xlsx", "XLSX", "raw"), psycopg.errors.CheckViolation, None, "a raw"),
    ],
)
def test_upload_file_refuses_bad_input_and_writes_nothing(
    db_url: str, args: tuple[Any, ...], error: type[Exception], column: str | None, says: str
) -> None:
    with dict_conn(db_url) as admin, connect(db_url, UPLOADER_LOGIN) as uploader:
        with pytest.raises(error, match=says) as refused:
            uploader.execute(
                "SELECT * FROM arm.upload_file(%s, %s, %s, %s, p_bucket_role => "
                "coalesce(%s, 'uploads'))",
                args,
            )
        if column is not None:
            assert refused.value.diag.column_name == column  # type: ignore[attr-defined]
        assert counts(admin) == [0, 0, 0]


@pytest.mark.parametrize("files", ["{}", '"x"', "[1]"])
def test_upload_files_wants_an_array_of_objects(db_url: str, files: str) -> None:
    with connect(db_url, UPLOADER_LOGIN) as uploader:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="file"):
            uploader.execute("SELECT * FROM arm.upload_files(%s::jsonb)", (files,))


def test_a_batch_wakes_the_publisher_once_at_most(db_url: str) -> None:
    """Into an empty queue: one NOTIFY for the whole batch. Into a queue that holds jobs:
    none (the publisher is awake already; tests/integration/test_wake_up.py has the rule)."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN arm_recognition_job_queued")
        with connect(db_url, UPLOADER_LOGIN) as uploader:
            uploader.execute("SELECT * FROM arm.upload_files(%s)", (Jsonb(batch(200)),))
            first = list(listener.notifies(timeout=2))
            uploader.execute("SELECT * FROM arm.upload_files(%s)", (Jsonb(batch(200)),))
            upload_file(uploader)
            second = list(listener.notifies(timeout=1))
    assert [n.channel for n in first] == ["arm_recognition_job_queued"]
    assert second == []


def docs_upload_sql() -> list[str]:
    """The SQL of docs/dbas.md "Uploading a file" (each block) and the README's call."""
    dbas = (ROOT / "docs" / "dbas.md").read_text()
    section = dbas.split("### Uploading a file", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```sql\n(.*?)```", section, flags=re.S)
    readme = (ROOT / "README.md").read_text()
    [call] = re.findall(r"`(SELECT \* FROM arm\.upload_file\(.*?\);)`", readme)
    return [*blocks, call]


def test_the_documented_uploads_run_in_psql_as_they_stand(db_url: str) -> None:
    """Pasted into psql as the uploader's login, every upload of the docs works, and the
    plain-SQL one writes the rows the function writes."""
    blocks = docs_upload_sql()
    assert len(blocks) == 4  # the function, the batch, the plain SQL; the README's call
    psql = str(find_pg_bindir() / "psql")
    for block in blocks:
        done = subprocess.run(
            [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", as_login(db_url, UPLOADER_LOGIN)],
            input=block,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    with dict_conn(db_url) as admin:
        assert counts(admin) == [5, 5, 5]
        files = admin.execute(
            "SELECT f.id FROM arm.stored_file f JOIN arm.s3_object o ON o.id = f.s3_object_id "
            "WHERE o.key LIKE 'uploads/3f8e2c1a-%%' ORDER BY f.created_at"
        ).fetchall()
        called, plain = (rows_of(admin, f["id"]) for f in files)
        assert called == plain


def test_the_dbas_first_block_runs_in_psql_as_it_stands(db_url: str) -> None:
    """docs/dbas.md's first SQL block (the SQL interface at a glance), pasted into psql
    as a DBA (a member of arm_owner): every statement runs; the example ids name no file,
    so each call answers not_found or changes nothing."""
    dbas = (ROOT / "docs" / "dbas.md").read_text()
    section = dbas.split("## The SQL interface", 1)[1].split("\n### ", 1)[0]
    [block] = re.findall(r"```sql\n(.*?)```", section, flags=re.S)
    assert "arm.retry_files(" in block and "arm.get_file(" in block
    done = subprocess.run(
        [str(find_pg_bindir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
         as_login(db_url, OWNER_LOGIN)],
        input=block, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not_found" in done.stdout, done.stdout
