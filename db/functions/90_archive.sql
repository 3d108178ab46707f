-- Retiring old history (migration 0011; docs/dbas.md, "Retiring old history"). The owner's
-- alone: a DBA runs it, as arm_owner, in batches, until it moves nothing.
--
-- arm.archive_files(p_finished_before, p_limit) moves up to p_limit files out of the hot
-- tables — the file, every attempt of it and every retry of it, into arm.archived_file,
-- arm.archived_job and arm.archived_retry_audit — in one statement, so that a file and its
-- jobs are never apart: the current job moves with its file or not at all. A file moves
-- when its current job is final and it has not changed since p_finished_before (its
-- current job finished, the file was updated and created before it); a file with a live
-- job never does (its current job would be live). At least a day of history always
-- stays: p_finished_before later than a day ago is refused.
--
-- Locks: the files and their current jobs, FOR UPDATE SKIP LOCKED, so a file a retry or
-- the inbox holds is left for the next batch and nobody waits for the archive. A retry that
-- waited for a moved file's lock then finds it gone, looks in the archive and refuses
-- (reason `archived`, arm.retry_file_v3); a late answer for a moved job is `unknown_job`,
-- as one for a job that never existed (a final job ignored it anyway).
--
-- The counts (arm.job_counts, arm.file_counts, the metrics' arm_jobs) describe the hot
-- tables: a batch lowers them by what it moved, and the console's finished-per-minute chart
-- shows no finished jobs for that minute rather than a negative number.
CREATE OR REPLACE FUNCTION arm.archive_files(p_finished_before timestamptz, p_limit integer)
RETURNS TABLE (files bigint, jobs bigint, retries bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    IF p_finished_before IS NULL OR p_finished_before > now() - interval '1 day' THEN
        RAISE EXCEPTION 'archive_files keeps at least the last day: p_finished_before (%) must be a day ago or earlier',
            p_finished_before
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'archive_files moves at least one file a batch: p_limit is %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    RETURN QUERY
    WITH picked AS (
        -- Oldest first, through the file list's index on created_at.
        SELECT f.id
        FROM arm.stored_file f
        JOIN arm.recognition_job j ON j.id = f.current_recognition_job_id
        WHERE f.created_at < p_finished_before
          AND f.updated_at < p_finished_before
          AND arm.is_final(j.status)
          AND j.finished_at < p_finished_before
        ORDER BY f.created_at, f.id
        LIMIT p_limit
        FOR UPDATE OF f, j SKIP LOCKED
    ),
    -- One statement: the foreign keys between the three hot tables are checked at its end,
    -- when the file, its jobs and its retries are all gone.
    gone_retries AS (
        DELETE FROM arm.retry_audit a USING picked p WHERE a.file_id = p.id RETURNING a.*
    ),
    gone_jobs AS (
        DELETE FROM arm.recognition_job j USING picked p WHERE j.file_id = p.id RETURNING j.*
    ),
    gone_files AS (
        DELETE FROM arm.stored_file f USING picked p WHERE f.id = p.id RETURNING f.*
    ),
    kept_retries AS (
        INSERT INTO arm.archived_retry_audit
            (id, file_id, old_job_id, new_job_id, new_attempt, actor, retried_at,
             actor_level)
        SELECT id, file_id, old_job_id, new_job_id, new_attempt, actor, retried_at,
               actor_level
        FROM gone_retries
        RETURNING 1
    ),
    kept_jobs AS (
        INSERT INTO arm.archived_job SELECT * FROM gone_jobs RETURNING 1
    ),
    kept_files AS (
        INSERT INTO arm.archived_file
            (id, consolidation_id, original_name, file_type, s3_object_id, status,
             current_recognition_job_id, created_at, updated_at, archived_at)
        SELECT id, consolidation_id, original_name, file_type, s3_object_id, status,
               current_recognition_job_id, created_at, updated_at, now()
        FROM gone_files
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM kept_files), (SELECT count(*) FROM kept_jobs),
           (SELECT count(*) FROM kept_retries);
END;
$$;
