-- Retired history: finished files older than a period, with every attempt and every retry
-- of them, moved out of the hot tables by arm.archive_files (db/functions/90_archive.sql),
-- which a DBA runs (docs/dbas.md, "Retiring old history"). The three tables have the
-- columns of their hot tables (a test keeps them equal), without the hot tables' indexes,
-- triggers and foreign keys: nothing writes an archived row again, and what reads one
-- (arm.get_file, a DBA) finds it by file. archived_file adds when it was moved.
-- depends: 0010_status_samples

CREATE TABLE arm.archived_file (LIKE arm.stored_file INCLUDING DEFAULTS);
ALTER TABLE arm.archived_file DROP COLUMN failed;  -- generated in the hot table
ALTER TABLE arm.archived_file
    ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now(),
    ADD PRIMARY KEY (id);

CREATE TABLE arm.archived_job (LIKE arm.recognition_job INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE arm.archived_job
    ADD PRIMARY KEY (id),
    ADD CONSTRAINT archived_job_file_attempt_key UNIQUE (file_id, attempt);

CREATE TABLE arm.archived_retry_audit (LIKE arm.retry_audit INCLUDING DEFAULTS);
ALTER TABLE arm.archived_retry_audit ADD PRIMARY KEY (id);
CREATE INDEX archived_retry_audit_file_idx ON arm.archived_retry_audit (file_id, retried_at);
