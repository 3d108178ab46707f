-- Per-status counts of jobs and files whose cost grows with what changed lately, not with
-- the history (the gauge arm_jobs{status} and GET /api/v1/status). A count(*)
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
-- Only the tables are created here. The trigger function, the triggers and the first
-- counts come from db/functions/80_status.sql, in the function files' transaction that
-- follows the migrations, under a lock that holds writers back (the previous release's
-- bridges keep writing while migrate runs): not a change can fall between the counts and
-- the first counted statement, and the triggers never fire a stand-in body.
-- locks: the first migrate after it counts every job and file under that lock
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
