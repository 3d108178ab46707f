-- Rolls back 0002: the 0001 indexes and constraints. Run it with the functions of the
-- release being rolled back to (the next migrate of that release re-applies them).

DROP INDEX arm.recognition_job_unacked_idx;
CREATE INDEX recognition_job_unacked_idx
    ON arm.recognition_job (last_published_at)
    WHERE status = 'published';
DROP INDEX arm.recognition_job_queued_idx;
CREATE INDEX recognition_job_queued_idx
    ON arm.recognition_job (requested_at)
    WHERE status = 'queued';

ALTER TABLE arm.stored_file DROP CONSTRAINT stored_file_original_name_length;
ALTER TABLE arm.s3_object
    DROP CONSTRAINT s3_object_key_length,
    DROP CONSTRAINT s3_object_bucket_length;

ALTER TABLE arm.recognition_job
    DROP CONSTRAINT recognition_job_republish_only_when_published,
    ADD CONSTRAINT recognition_job_republish_only_when_published CHECK (
        republish_count = 0 OR status <> 'queued'
    );

-- Jobs dead-lettered before they were ever published (arm.dead_letter_unpublishable)
-- break the 0001 form of this constraint. They are final and never updated again, so the
-- rollback keeps them: the constraint comes back NOT VALID when such rows exist (new and
-- updated rows are still checked) and validated, exactly as 0001 made it, otherwise.
ALTER TABLE arm.recognition_job
    DROP CONSTRAINT recognition_job_published_fields,
    ADD CONSTRAINT recognition_job_published_fields CHECK (
        (status = 'queued') = (published_at IS NULL)
        AND (status = 'queued') = (request_msg_id IS NULL)
        AND (status = 'queued') = (request_subject IS NULL)
        AND (status = 'queued') = (reply_deadline IS NULL)
        AND (status = 'queued') = (last_published_at IS NULL)
    ) NOT VALID;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM arm.recognition_job
                   WHERE status <> 'queued' AND published_at IS NULL) THEN
        ALTER TABLE arm.recognition_job VALIDATE CONSTRAINT recognition_job_published_fields;
    END IF;
END;
$$;
