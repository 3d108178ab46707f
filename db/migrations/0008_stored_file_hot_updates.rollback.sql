-- Rolls back 0008: the status and current-job indexes come back, `failed` goes.
DROP INDEX IF EXISTS arm.stored_file_failed_created_idx;
ALTER TABLE arm.stored_file DROP COLUMN IF EXISTS failed;
CREATE INDEX IF NOT EXISTS stored_file_status_created_idx
    ON arm.stored_file (status, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS stored_file_current_job_idx
    ON arm.stored_file (current_recognition_job_id);
