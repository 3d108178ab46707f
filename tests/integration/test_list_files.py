"""arm.list_files, the file list of GET /api/v1/files, called as the API's
login (a member of arm_api only): every filter alone and combined, the keyset, `retryable`
against what arm.retry_file really does, Cyrillic `q` on a database created with
LOCALE 'C', and the plans that keep a page's cost independent of the table's size.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from arm_core.db import query
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.sql import (
    API_LOGIN,
    Conn,
    Upload,
    ack,
    as_login,
    fail_by_no_ack,
    fail_by_timeout,
    publish,
    result,
    retry,
    scalar,
    upload,
    upload_many,
)
from arm_core.migrate import migrate
from arm_core.rows import FileListFilter
from arm_core.store import file_list_params

pytestmark = pytest.mark.integration

NO_FILTER = file_list_params(50, FileListFilter())  # every file: the filters given override


@pytest.fixture
def api_conn(db_url: str) -> Iterator[Conn]:
    """The test's database as the API's login: list_files runs with arm_api's rights."""
    with psycopg.connect(as_login(db_url, API_LOGIN), autocommit=True, row_factory=dict_row) as c:
        yield c


def page(api: Conn, limit: int = 50, **filters: Any) -> list[dict[str, Any]]:
    params = {**NO_FILTER, **filters, "limit": limit}
    return api.execute(query("list_files"), params).fetchall()


def ids(rows: list[dict[str, Any]]) -> list[uuid.UUID]:
    return [r["id"] for r in rows]


def set_max_attempts(conn: Conn, n: int) -> None:
    conn.execute("SELECT arm.set_setting('default_max_attempts', %s)", (str(n),))


def zoo(conn: Conn) -> dict[str, Upload]:
    """One file whose current job is in each status, plus one that failed on its last
    attempt, uploaded in this order (so created_at orders them)."""
    files: dict[str, Upload] = {}
    files["timeout"] = upload(conn, name="Таймаут.xlsx")
    fail_by_timeout(conn, files["timeout"])  # publishes and sweeps every live job: first
    files["dlq"] = upload(conn, "PDF", name="скан ДЛК.pdf")
    publish(conn)
    fail_by_no_ack(conn)
    for status in ("error", "done", "needs_check", "exhausted", "processing"):
        if status == "exhausted":
            set_max_attempts(conn, 1)
        up = files[status] = upload(conn, name=f"{status} ОСВ.xlsx")
        set_max_attempts(conn, 3)
        publish(conn)
        ack(conn, up.job_id, up.file_id)
        if status != "processing":
            final = "error" if status == "exhausted" else status
            error = ("PARSE_FAILED", "bad sheet") if final == "error" else None
            result(conn, up.job_id, up.file_id, status=final, error=error)
    files["published"] = upload(conn, name="published.xlsx")
    publish(conn)
    files["queued"] = upload(conn, name="queued.XLSX")
    return files


def test_each_item_is_the_file_its_current_job_and_whether_it_can_be_retried(
    conn: Conn, api_conn: Conn
) -> None:
    files = zoo(conn)
    rows = {r["id"]: r for r in page(api_conn)}
    assert set(rows) == {f.file_id for f in files.values()}
    expected_status = {
        "timeout": ("ERROR", "timeout", "TIMEOUT"),
        "dlq": ("ERROR", "dlq", "NO_ACK"),
        "error": ("ERROR", "error", "PARSE_FAILED"),
        "exhausted": ("ERROR", "error", "PARSE_FAILED"),
        "done": ("PROCESSING", "done", None),
        "needs_check": ("PROCESSING", "needs_check", None),
        "processing": ("PROCESSING", "processing", None),
        "published": ("UPLOADED", "published", None),
        "queued": ("UPLOADED", "queued", None),
    }
    for name, up in files.items():
        row = rows[up.file_id]
        assert (row["status"], row["job_status"], row["error_code"]) == expected_status[name], name
        assert row["job_id"] == up.job_id
        assert (row["attempt"], row["max_attempts"]) == (1, 1 if name == "exhausted" else 3)
        assert row["s3_key"] == up.key and row["s3_bucket"] == "arm-ka"
        assert row["file_type"] == ("PDF" if name == "dlq" else "XLSX")
        assert isinstance(row["created_at"], dt.datetime)
    retryable = {name for name, up in files.items() if rows[up.file_id]["retryable"]}
    assert retryable == {"timeout", "dlq", "error"}

    # The same rule as arm.retry_file: retryable exactly when a retry creates an attempt.
    for name, up in files.items():
        with conn.transaction(force_rollback=True):
            outcome = retry(conn, up.file_id)["outcome"]
        assert (outcome == "retried") is rows[up.file_id]["retryable"], (name, outcome)


def test_a_retried_file_shows_its_new_attempt_and_is_not_retryable_while_it_runs(
    conn: Conn, api_conn: Conn
) -> None:
    files = zoo(conn)
    retried = retry(conn, files["error"].file_id)
    [row] = page(api_conn, q="error ОСВ")
    assert (row["job_id"], row["job_status"], row["attempt"]) == (retried["job_id"], "queued", 2)
    assert (row["status"], row["error_code"], row["retryable"]) == ("UPLOADED", None, False)


def test_a_file_without_a_job_is_listed_with_no_current_job(conn: Conn, api_conn: Conn) -> None:
    obj = scalar(
        conn,
        "INSERT INTO arm.s3_object (bucket, key, bucket_role) VALUES ('b', 'k', 'uploads') "
        "RETURNING id",
    )
    file_id = scalar(
        conn,
        "INSERT INTO arm.stored_file (original_name, file_type, s3_object_id) "
        "VALUES ('без задачи.pdf', 'PDF', %s) RETURNING id",
        (obj,),
    )
    [row] = page(api_conn)
    assert row["id"] == file_id
    assert (row["job_id"], row["job_status"], row["attempt"], row["retryable"]) == (
        None,
        None,
        None,
        False,
    )
    assert page(api_conn, job_statuses=["queued"]) == []


def test_each_filter_alone_and_combined(conn: Conn, api_conn: Conn) -> None:
    files = zoo(conn)
    consolidation = uuid.uuid4()
    extra = upload(conn, "PNG", name="Фото ОСВ.png", consolidation_id=consolidation)
    f = {name: up.file_id for name, up in files.items()} | {"extra": extra.file_id}
    newest_first = list(reversed(list(f.values())))
    assert ids(page(api_conn)) == newest_first

    def names(rows: list[dict[str, Any]]) -> set[str]:
        by_id = {v: k for k, v in f.items()}
        return {by_id[r["id"]] for r in rows}

    errors = {"timeout", "dlq", "error", "exhausted"}
    assert names(page(api_conn, statuses=["ERROR"])) == errors
    assert names(page(api_conn, statuses=["UPLOADED", "ERROR"])) == errors | {
        "published",
        "queued",
        "extra",
    }
    assert names(page(api_conn, job_statuses=["dlq", "timeout"])) == {"dlq", "timeout"}
    assert names(page(api_conn, job_statuses=["error"])) == {"error", "exhausted"}
    assert names(page(api_conn, consolidation_id=consolidation)) == {"extra"}
    assert names(page(api_conn, file_types=["PDF", "PNG"])) == {"dlq", "extra"}
    assert names(page(api_conn, q="осв")) == {
        "error",
        "done",
        "needs_check",
        "exhausted",
        "processing",
        "extra",
    }
    assert names(page(api_conn, q="xlsx")) >= {"queued", "published", "timeout"}
    # Combined: every filter narrows.
    assert names(page(api_conn, statuses=["ERROR"], q="ОСВ")) == {"error", "exhausted"}
    assert names(page(api_conn, statuses=["ERROR"], job_statuses=["error"], q="exh")) == {
        "exhausted"
    }
    assert page(api_conn, statuses=["ERROR"], file_types=["PNG"]) == []
    assert names(page(api_conn, statuses=["UPLOADED"], consolidation_id=consolidation)) == {"extra"}

    # updated_after / updated_before: exclusive bounds on updated_at (set in the past with
    # the touch trigger off, as a DBA restoring old rows would).
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        for name, day in (("done", "2026-01-02T00:00:00Z"), ("queued", "2026-01-03T00:00:00Z")):
            conn.execute("UPDATE arm.stored_file SET updated_at = %s WHERE id = %s", (day, f[name]))
    day2 = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    day3 = dt.datetime(2026, 1, 3, tzinfo=dt.UTC)
    assert names(page(api_conn, updated_before=day3)) == {"done"}
    assert names(page(api_conn, updated_after=day2, updated_before=day3 + dt.timedelta(1))) == {
        "queued"
    }
    assert names(page(api_conn, updated_after=day3 + dt.timedelta(1))) == set(f) - {
        "done",
        "queued",
    }
    assert names(page(api_conn, updated_before=day3, statuses=["ERROR"])) == set()


# Names and searches with every kind of character the pattern must treat right: regular
# expression syntax, backslashes, case pairs of each script, letters without case, digits.
NAMES = [
    "ОСВ Март 2026.XLSX",
    "оборотно-сальдовая (копия) [1].xlsx",
    "Ёлка Ґанок Їжак Єнот.pdf",
    "ÉTÉ Straße naïve.png",
    "ΣΟΦΙΑ σοφια.jpg",
    r"a.b*c+d?e^f$g|h(i)j{k}l\m-n/o 100% _x_.xls",
    "İstanbul ı ß Ǆ 😀 ١٢٣.pdf",
    "1000 отчётX1 x1x.xlsx",  # what "100%" and "_X_" would find as unescaped LIKE patterns
]
SEARCHES = [
    "осв",
    "МАРТ 2026",
    "(КОПИЯ) [1]",
    "ёлка ґанок їжак єнот",
    "été STRASSE",
    "straße",
    "σοφια ΣΟΦΙΑ",
    "a.b*c+d?e^f$g|h(i)j{k}l\\m",
    ".",
    "b*",
    "\\",
    "100%",
    "_X_",
    "[1]",
    "ǆ",
    "😀",
    "١٢٣",
    "İSTANBUL",
    "ı",
    "x" * 3,
    "е",
    "Ё",
]


def disagreements(db: Conn) -> tuple[list[tuple[str, str]], int]:
    """The (name, search) pairs where arm.name_pattern (what list_files runs) and its
    definition, strpos over arm.fold_name, disagree; and how many pairs matched."""
    pairs = []
    for name in NAMES:
        # every search, and the name's own substrings with their case swapped
        own = [name[i : i + 4].swapcase() for i in range(0, len(name), 3)]
        pairs += [(name, q) for q in SEARCHES + own]
    rows = db.execute(
        """
        SELECT n, q, n COLLATE "C" ~ arm.name_pattern(q) AS by_pattern,
               strpos(arm.fold_name(n), arm.fold_name(q)) > 0 AS by_folding
        FROM unnest(%s::text[], %s::text[]) AS p(n, q)
        """,
        ([n for n, _ in pairs], [q for _, q in pairs]),
    ).fetchall()
    wrong = [(r[0], r[1]) for r in rows if r[2] != r[3]]
    return wrong, sum(1 for r in rows if r[3])


def test_the_pattern_finds_what_folding_finds(c_locale_url: str, db_url: str) -> None:
    """In the suite's database and in one created with LOCALE 'C'."""
    for url in (db_url, c_locale_url):
        with psycopg.connect(url, autocommit=True) as db:
            wrong, matched = disagreements(db)
        assert wrong == [], url
        assert matched > len(NAMES) * 3  # many do match


def test_q_is_a_literal_substring(conn: Conn, api_conn: Conn) -> None:
    percent = upload(conn, name="100% отчёт_1.xlsx")
    upload(conn, name="1000 отчётX1.xlsx")
    assert ids(page(api_conn, q="%")) == [percent.file_id]
    assert ids(page(api_conn, q="т_1")) == [percent.file_id]
    assert ids(page(api_conn, q="ОТЧЁТ_")) == [percent.file_id]
    assert page(api_conn, q="\\") == []


def test_keyset_pages_cover_every_file_once_in_order_with_equal_created_at(
    conn: Conn, api_conn: Conn
) -> None:
    upload_many(conn, 25)  # one transaction: one created_at, so id breaks the ties
    expected = ids(page(api_conn, limit=100))
    assert len(expected) == 25
    seen: list[uuid.UUID] = []
    after: tuple[dt.datetime, uuid.UUID] | None = None
    while True:
        keyset = {"after_created_at": after[0], "after_id": after[1]} if after else {}
        rows = page(api_conn, limit=7, **keyset)
        if not rows:
            break
        seen += ids(rows)
        after = (rows[-1]["created_at"], rows[-1]["id"])
    assert seen == expected
    # And with a status filter (the per-status walk), the same order.
    assert ids(page(api_conn, limit=100, statuses=["UPLOADED", "ERROR"])) == expected


def test_the_limit_and_the_keyset_are_checked(api_conn: Conn) -> None:
    for limit in (0, 1002):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="p_limit"):
            page(api_conn, limit=limit)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="keyset"):
        page(api_conn, after_created_at=dt.datetime.now(dt.UTC))


# --- case-insensitive search whatever the locale ------------------------------------


@pytest.fixture
def c_locale_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A database created with LOCALE 'C' (collation and ctype C), migrated."""
    name = f"arm_c_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'").format(
                sql.Identifier(name)
            )
        )
    try:
        migrate(pg_server.url(name))
        yield pg_server.url(name)
    finally:
        with psycopg.connect(pg_server.url(), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_cyrillic_q_is_case_insensitive_on_a_c_locale_database(c_locale_url: str) -> None:
    with psycopg.connect(c_locale_url, autocommit=True, row_factory=dict_row) as conn:
        locale = "SELECT datcollate, datctype FROM pg_database WHERE datname = current_database()"
        assert conn.execute(locale).fetchone() == {"datcollate": "C", "datctype": "C"}
        # The premise: here lower() and ILIKE leave Cyrillic alone.
        assert scalar(conn, "SELECT lower('ОБОРОТНО-САЛЬДОВАЯ')") == "ОБОРОТНО-САЛЬДОВАЯ"
        assert scalar(conn, "SELECT 'ВЕДОМОСТЬ' ILIKE %s", ("%ведомость%",)) is False
        upper = upload(conn, name="ОБОРОТНО-САЛЬДОВАЯ ВЕДОМОСТЬ 2026.XLSX")
        lower = upload(conn, name="оборотно-сальдовая ведомость (копия).xlsx")
        mixed = upload(conn, name="Ведомость Ёлки Ґанок ÉTÉ.pdf", file_type="PDF")
        upload(conn, name="Счёт-фактура.png", file_type="PNG")
    with psycopg.connect(
        as_login(c_locale_url, API_LOGIN), autocommit=True, row_factory=dict_row
    ) as api:
        both = [lower.file_id, upper.file_id]
        assert ids(page(api, q="ведомость")) == [mixed.file_id, *both]
        assert ids(page(api, q="ОБОРОТНО-сальдовая")) == both
        assert ids(page(api, q="ёлки ґанок été")) == [mixed.file_id]
        assert ids(page(api, q="xlsx")) == both
        assert page(api, q="елки") == []  # ё is its own letter


# --- plans: a page costs the same at any size -----------------------------------------


def plans_of(conn: Conn, api_params: dict[str, Any]) -> str:
    """The plans of every statement list_files runs (its dynamic page query included),
    as auto_explain prints them, sent to this client as notices."""
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_level = notice")
    conn.execute(query("list_files"), {**NO_FILTER, **api_params}).fetchall()
    conn.execute("RESET auto_explain.log_min_duration")
    return "\n".join(notices)


def test_a_page_is_an_index_walk_that_stops_at_the_limit(conn: Conn) -> None:
    upload_many(conn, 3000)
    with conn.transaction():  # 1% of them failed (set directly: the guard is not the point)
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            "UPDATE arm.stored_file SET status = 'ERROR'"
            " WHERE id IN (SELECT id FROM arm.stored_file ORDER BY id LIMIT 30)"
        )
    conn.execute("ANALYZE arm.stored_file")
    conn.execute("ANALYZE arm.recognition_job")

    def no_whole_table(plans: str) -> None:
        assert not re.search(r"Seq Scan|Bitmap|Hash (\w+ )?Join", plans), plans

    plans = plans_of(conn, {"limit": 51})
    no_whole_table(plans)
    walk = plans[plans.index("Limit") :]
    assert "Index Scan using stored_file_created_idx on stored_file" in walk, plans

    last = page(conn, 51)[-1]
    after = {"after_created_at": last["created_at"], "after_id": last["id"]}
    plans = plans_of(conn, {"limit": 51, **after})
    no_whole_table(plans)
    assert "Index Scan using stored_file_created_idx on stored_file" in plans, plans
    assert "Index Cond: (ROW(created_at, id) < ROW(" in plans, plans

    # The rare status: its partial index, walked from its newest entry.
    plans = plans_of(conn, {"limit": 51, "statuses": ["ERROR"]})
    no_whole_table(plans)
    assert "Index Scan using stored_file_failed_created_idx on stored_file" in plans, plans
    # With another: one bounded walk each (the other on the newest-first index), merged.
    plans = plans_of(conn, {"limit": 51, "statuses": ["ERROR", "UPLOADED"]})
    no_whole_table(plans)
    assert "Index Scan using stored_file_failed_created_idx on stored_file" in plans, plans
    assert "Index Scan using stored_file_created_idx on stored_file" in plans, plans
    assert plans.count("Limit") >= 2, plans
    # job_status has no index: the planner walks the newest-first index when it expects
    # many matches, and reads the table when it expects few (docs/operators.md "The file
    # list"). q has the trigram index (below).
    plans = plans_of(conn, {"limit": 51, "job_statuses": ["queued"]})
    assert "stored_file_name_trgm_idx" not in plans, plans


# --- q through the trigram index (migration 0006) -------------------------------------


def pages_with_cap(api: Conn, cap: int | None, limit: int, **filters: Any) -> list[uuid.UUID]:
    """Every page of the list, cursor after cursor, with arm.list_files_q_cap set to cap
    (0: q always walks the list; a large cap: q's matches always come from the trigram
    index; None: list_files' own cap)."""
    api.execute(
        "SELECT set_config('arm.list_files_q_cap', %s, false)", ("" if cap is None else str(cap),)
    )
    seen: list[uuid.UUID] = []
    after: dict[str, Any] = {}
    while True:
        rows = page(api, limit=limit, **filters, **after)
        seen += ids(rows)
        if len(rows) < limit:
            return seen
        after = {"after_created_at": rows[-1]["created_at"], "after_id": rows[-1]["id"]}


def trigram_scans(api: Conn, **filters: Any) -> int:
    """How many scans of the trigram index one call of list_files made."""
    scans = "SELECT pg_stat_get_xact_numscans('arm.stored_file_name_trgm_idx'::regclass)"
    with api.transaction():  # the backend's pending counts: no flush inside a transaction
        before = scalar(api, scans)
        page(api, **filters)
        return scalar(api, scans) - before


def test_both_strategies_of_q_give_the_same_pages(c_locale_url: str, db_url: str) -> None:
    """The walk (name_pattern) and the trigram index (LIKE over fold_name) find the same
    files in the same order, page by page through the cursor, with and without a status
    filter — in the suite's database and in one created with LOCALE 'C'; and with the
    index dropped (a database without pg_trgm) the list gives them too."""
    for url in (db_url, c_locale_url):
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            for copy in range(3):
                for name in NAMES:
                    upload(conn, name=f"{copy} {name}" if copy else name)
            with conn.transaction():  # every third file failed
                conn.execute("SET LOCAL session_replication_role = replica")
                conn.execute(
                    "UPDATE arm.stored_file SET status = 'ERROR'"
                    " WHERE get_byte(uuid_send(id), 15) % 3 = 0"
                )
            searches = [q for q in SEARCHES if len(q) >= 3]
            searches += [n[i : i + 5].swapcase() for n in NAMES for i in range(0, len(n), 4)]
            searches += ["0 ", "1 ос", "2 ёЛКА", "ΣΟΦΙΑ", "tanbul", "no such name"]

            def expected(q: str, statuses: list[str] | None = None) -> list[uuid.UUID]:
                return [
                    r["id"]
                    for r in conn.execute(
                        "SELECT id FROM arm.stored_file"
                        " WHERE strpos(arm.fold_name(original_name), arm.fold_name(%s)) > 0"
                        " AND (%s::arm.file_status[] IS NULL OR status = ANY (%s))"
                        " ORDER BY created_at DESC, id DESC",
                        (q, statuses, statuses),
                    ).fetchall()
                ]

            with psycopg.connect(
                as_login(url, API_LOGIN), autocommit=True, row_factory=dict_row
            ) as api:
                for q in searches:
                    for statuses in (None, ["ERROR"]):
                        want = expected(q, statuses)
                        for cap in (0, 100_000):
                            got = pages_with_cap(api, cap, 2, q=q, statuses=statuses)
                            assert got == want, (url, q, statuses, cap)
                pages_with_cap(api, None, 2)
                # The index strategy really ran (a run of 3 ASCII letters has trigrams in
                # any locale; the planner told to use an index, which on a few rows it
                # would not), and a q too short for a trigram never asks the index.
                api.execute("SET enable_seqscan = off")
                assert trigram_scans(api, q="STRAßE") >= 1, url
                assert len(page(api, q="STRAßE")) == 3
                assert trigram_scans(api, q="ße") == 0, url
                assert trigram_scans(api, q="1 ос") == 0, url  # no 3 letters in a row
                api.execute("RESET enable_seqscan")

                conn.execute("DROP INDEX arm.stored_file_name_trgm_idx")
                for q in searches:
                    assert pages_with_cap(api, None, 3, q=q) == expected(q), (url, q)


def test_a_rare_q_is_read_through_the_trigram_index_and_a_common_one_walks(
    conn: Conn,
) -> None:
    upload_many(conn, 3000)  # named uploads/burst/1 … uploads/burst/3000
    conn.execute("ANALYZE arm.stored_file")
    conn.execute("ANALYZE arm.recognition_job")

    # Rare: the ids of the matches by the index, the page by primary key; no walk, no
    # read of the table. (On 3,000 rows the planner would rather read the table's 40
    # pages; told not to, it shows the plan it picks on a large table — benchmarks/files.py
    # measures that one at 1,000,000 files.)
    conn.execute("SET enable_seqscan = off")
    plans = plans_of(conn, {"limit": 51, "q": "BURST/1234"})
    conn.execute("RESET enable_seqscan")
    assert "Bitmap Index Scan on stored_file_name_trgm_idx" in plans, plans
    assert not re.search(r"Seq Scan|Hash (\w+ )?Join|stored_file_created_idx", plans), plans
    assert [r["original_name"] for r in page(conn, 51, q="BURST/1234")] == ["uploads/burst/1234"]
    assert len(page(conn, 51, q="burst/123")) == 11

    # Common: more matches than the cap (200), so the newest-first walk, stopped at the
    # limit.
    plans = plans_of(conn, {"limit": 51, "q": "Uploads/"})
    walk = plans[plans.index("Limit") :]
    assert "Index Scan using stored_file_created_idx on stored_file" in walk, plans
    assert len(page(conn, 51, q="Uploads/")) == 51


def test_migration_0006_defines_fold_name_with_the_function_file_s_body() -> None:
    """The trigram index is built with the fold_name that list_files searches with: 0006
    and db/functions/75_list_files.sql hold the same definition."""
    db = Path(__file__).resolve().parents[2] / "db"
    pattern = r"CREATE OR REPLACE FUNCTION arm\.fold_name\(p_name text\).*?\n\$\$;\n"
    migration = db / "migrations" / "0006_file_name_trigram_index.sql"
    [in_migration] = re.findall(pattern, migration.read_text(), re.S)
    [in_functions] = re.findall(pattern, (db / "functions" / "75_list_files.sql").read_text(), re.S)
    assert in_migration == in_functions
