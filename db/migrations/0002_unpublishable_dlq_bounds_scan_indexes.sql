-- The throughput rework, the schema side:
--   * a queued job whose request cannot be published may go to dlq (arm.dead_letter_unpublishable),
--     so the publish fields are "all or nothing", required for every status but queued and dlq;
--   * plain-SQL uploads are bounded as the request contract bounds them;
--   * the claim indexes cover the claims' ORDER BY, so a claim reads only what it returns.
-- The functions that use these live in db/functions and are re-applied after this.
-- depends: 0001_core_schema

-- The five fields a publish writes are present all together or absent all together:
-- absent while queued, present for every later status except dlq, which a job may also
-- reach from queued (its request could not be published: too large for the server's
-- max_payload, or refused). Every row that passed the 0001 constraint passes this one,
-- so validating it here cannot fail on existing data.
ALTER TABLE arm.recognition_job
    DROP CONSTRAINT recognition_job_published_fields,
    ADD CONSTRAINT recognition_job_published_fields CHECK (
        (published_at IS NULL) = (request_msg_id IS NULL)
        AND (published_at IS NULL) = (request_subject IS NULL)
        AND (published_at IS NULL) = (reply_deadline IS NULL)
        AND (published_at IS NULL) = (last_published_at IS NULL)
        AND (status <> 'queued' OR published_at IS NULL)
        AND (status IN ('queued', 'dlq') OR published_at IS NOT NULL)
    );

-- "status <> queued" no longer means "published" (a dlq job may never have gone out):
-- a republish is counted only on a job that was published. Rows valid under 0001 had
-- published_at whenever their status was not queued, so they pass.
ALTER TABLE arm.recognition_job
    DROP CONSTRAINT recognition_job_republish_only_when_published,
    ADD CONSTRAINT recognition_job_republish_only_when_published CHECK (
        republish_count = 0 OR published_at IS NOT NULL
    );

-- Bounds of plain-SQL uploads, as docs/contracts/recognition-request.schema.json bounds
-- the request built from them (S3: bucket names at most 63 characters, keys at most 1024;
-- file names at most 1024). A row over a bound could never be published as a valid
-- request; the constraint's name tells the uploader which bound it broke.
-- NOT VALID: rows an older release already stored are not re-checked, so this migration
-- cannot fail on old data (and takes its lock only briefly); every new row is checked.
-- PostgreSQL also checks a NOT VALID constraint on every UPDATE, so an old row over a
-- bound can no longer be updated (a status change of its file would fail). Find such rows
-- with the constraint's expression negated, fix them, then
--   ALTER TABLE arm.stored_file VALIDATE CONSTRAINT stored_file_original_name_length;
-- (likewise the two s3_object constraints).
ALTER TABLE arm.s3_object
    ADD CONSTRAINT s3_object_bucket_length CHECK (char_length(bucket) <= 63) NOT VALID,
    ADD CONSTRAINT s3_object_key_length CHECK (char_length(key) <= 1024) NOT VALID;
ALTER TABLE arm.stored_file
    ADD CONSTRAINT stored_file_original_name_length CHECK (char_length(original_name) <= 1024)
    NOT VALID;

-- The claims read their index in the order they return rows, so LIMIT stops the scan:
-- claim_queued_jobs orders by (requested_at, id), and the uploads of one transaction
-- share requested_at (now()), so an index on requested_at alone left a sort of the whole
-- backlog under every claim. Likewise claim_unacked_jobs orders by (last_published_at, id).
DROP INDEX arm.recognition_job_queued_idx;
CREATE INDEX recognition_job_queued_idx
    ON arm.recognition_job (requested_at, id)
    WHERE status = 'queued';
DROP INDEX arm.recognition_job_unacked_idx;
CREATE INDEX recognition_job_unacked_idx
    ON arm.recognition_job (last_published_at, id)
    WHERE status = 'published';
