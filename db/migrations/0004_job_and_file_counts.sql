-- Per-status counts of jobs and files whose cost grows with what changed lately, not with
-- the history (issue 11: the gauge arm_jobs{status} and GET /api/v1/status). A count(*)
-- per status would read every final job and every file ever stored.
--
-- Each statement that inserts, updates or deletes rows of recognition_job (stored_file)
-- appends its net change per status to the *_delta table, from statement-level triggers
-- with transition tables (db/functions/80_status.sql): an INSERT of a few rows per
-- statement, never an UPDATE of a shared counter row, so concurrent writers do not queue
-- on one hot row. arm.compact_counts() (the bridge's schedule runner calls it every few
-- seconds) folds the deltas into the *_count tables; arm.job_counts() and
-- arm.file_counts() add what is not folded yet.
--
-- The triggers are created here, in the transaction that backfills the counts under a
-- lock that holds writers back: not a change can fall between the backfill and the first
-- counted statement. Their function comes with its real body (the previous release's
-- bridges keep writing while migrate runs: a stand-in would lose their changes until
-- db/functions is applied); db/functions/80_status.sql re-applies the same body on every
-- migrate — change both together.
-- depends: 0003_stored_file_fillfactor

CREATE TABLE arm.job_count (
    status arm.job_status PRIMARY KEY,
    n      bigint NOT NULL
);
CREATE TABLE arm.job_count_delta (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status arm.job_status NOT NULL,
    n      bigint NOT NULL
);
CREATE TABLE arm.file_count (
    status arm.file_status PRIMARY KEY,
    n      bigint NOT NULL
);
CREATE TABLE arm.file_count_delta (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status arm.file_status NOT NULL,
    n      bigint NOT NULL
);

CREATE OR REPLACE FUNCTION arm.tg_count_statuses()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    IF TG_TABLE_NAME = 'recognition_job' THEN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO arm.job_count_delta (status, n)
            SELECT r.status, count(*) FROM new_rows r GROUP BY r.status;
        ELSIF TG_OP = 'UPDATE' THEN
            INSERT INTO arm.job_count_delta (status, n)
            SELECT c.status, sum(c.n)
            FROM (SELECT r.status, 1 AS n FROM new_rows r
                  UNION ALL
                  SELECT r.status, -1 FROM old_rows r) c
            GROUP BY c.status
            HAVING sum(c.n) <> 0;
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO arm.job_count_delta (status, n)
            SELECT r.status, -count(*) FROM old_rows r GROUP BY r.status;
        ELSE  -- TRUNCATE
            DELETE FROM arm.job_count_delta;
            UPDATE arm.job_count SET n = 0 WHERE n <> 0;
        END IF;
    ELSE
        IF TG_OP = 'INSERT' THEN
            INSERT INTO arm.file_count_delta (status, n)
            SELECT r.status, count(*) FROM new_rows r GROUP BY r.status;
        ELSIF TG_OP = 'UPDATE' THEN
            INSERT INTO arm.file_count_delta (status, n)
            SELECT c.status, sum(c.n)
            FROM (SELECT r.status, 1 AS n FROM new_rows r
                  UNION ALL
                  SELECT r.status, -1 FROM old_rows r) c
            GROUP BY c.status
            HAVING sum(c.n) <> 0;
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO arm.file_count_delta (status, n)
            SELECT r.status, -count(*) FROM old_rows r GROUP BY r.status;
        ELSE
            DELETE FROM arm.file_count_delta;
            UPDATE arm.file_count SET n = 0 WHERE n <> 0;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

LOCK TABLE arm.recognition_job, arm.stored_file IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER tg_recognition_job__count_insert
    AFTER INSERT ON arm.recognition_job REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
CREATE TRIGGER tg_recognition_job__count_update
    AFTER UPDATE ON arm.recognition_job REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
CREATE TRIGGER tg_recognition_job__count_delete
    AFTER DELETE ON arm.recognition_job REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
CREATE TRIGGER tg_recognition_job__count_truncate
    AFTER TRUNCATE ON arm.recognition_job
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
CREATE TRIGGER tg_stored_file__count_insert
    AFTER INSERT ON arm.stored_file REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
CREATE TRIGGER tg_stored_file__count_update
    AFTER UPDATE ON arm.stored_file REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
CREATE TRIGGER tg_stored_file__count_delete
    AFTER DELETE ON arm.stored_file REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
CREATE TRIGGER tg_stored_file__count_truncate
    AFTER TRUNCATE ON arm.stored_file
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();

INSERT INTO arm.job_count (status, n)
SELECT s, (SELECT count(*) FROM arm.recognition_job j WHERE j.status = s)
FROM unnest(enum_range(NULL::arm.job_status)) AS s;
INSERT INTO arm.file_count (status, n)
SELECT s, (SELECT count(*) FROM arm.stored_file f WHERE f.status = s)
FROM unnest(enum_range(NULL::arm.file_status)) AS s;
