-- A file's updates after its upload become HOT again (heap-only: no entry in any index,
-- less WAL, no work for the trigram GIN index): the two that every file has — the
-- upload's `SET current_recognition_job_id` and the ack's status UPLOADED → PROCESSING —
-- changed an indexed column, so each wrote an entry in every index of stored_file
-- (primary key, created, consolidation, current job, status, trigram: six).
--
-- * stored_file_current_job_idx goes. Every function finds a file by its primary key
--   (`f.id = … AND f.current_recognition_job_id = …`), and the foreign key from
--   current_recognition_job_id is only checked by a job's DELETE (jobs are never
--   deleted: their history is the audit).
-- * stored_file_status_created_idx (migration 0005) goes; the file list's rare status,
--   ERROR, gets a partial index on a generated column instead: `failed` is
--   status = 'ERROR', stored, and the index's predicate reads `failed`, not `status`.
--   PostgreSQL decides HOT by the indexed columns' values: UPLOADED → PROCESSING leaves
--   `failed` false, so it is HOT; only a failure (→ ERROR) or a retry (ERROR →
--   UPLOADED) writes index entries. The other statuses are common (PROCESSING) or the
--   newest files (UPLOADED): arm.list_files walks stored_file_created_idx for them.
--
-- ADD COLUMN … GENERATED … STORED rewrites the table under an exclusive lock: on a large
-- table, run this migration in a quiet hour (about a second per million files here).
-- depends: 0007_drop_publish_queued_jobs_and_apply_envelopes_v1

DROP INDEX IF EXISTS arm.stored_file_current_job_idx;
DROP INDEX IF EXISTS arm.stored_file_status_created_idx;
ALTER TABLE arm.stored_file
    ADD COLUMN failed boolean GENERATED ALWAYS AS (status = 'ERROR') STORED;
CREATE INDEX stored_file_failed_created_idx
    ON arm.stored_file (created_at DESC, id DESC) WHERE failed;
