-- Read models for the API and for DBAs. Read-only.
-- get_file is SECURITY DEFINER, executable by arm_api and arm_readonly (db/grants.sql);
-- job_view, a helper of it, stays PUBLIC without a SET clause and reads arm.s3_object
-- with its caller's rights.

-- One job as the API shows it: status, times, service, error, result, republishes.
CREATE OR REPLACE FUNCTION arm.job_view(j arm.recognition_job)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object(
        'job_id', j.id,
        'attempt', j.attempt,
        'max_attempts', j.max_attempts,
        'pipeline', j.pipeline,
        'status', j.status,
        'requested_at', j.requested_at,
        'published_at', j.published_at,
        'reply_deadline', j.reply_deadline,
        'started_at', j.started_at,
        'finished_at', j.finished_at,
        'request_msg_id', j.request_msg_id,
        'republish_count', j.republish_count,
        'service', CASE WHEN j.service_name IS NOT NULL THEN
            jsonb_build_object('name', j.service_name, 'version', j.service_version) END,
        'error', CASE WHEN j.error_code IS NOT NULL THEN
            jsonb_build_object('code', j.error_code, 'message', j.error_message) END,
        'result', (SELECT jsonb_build_object('bucket', o.bucket, 'key', o.key,
                                             'schema_version', j.result_schema_version,
                                             'msg_id', j.result_msg_id)
                   FROM arm.s3_object o WHERE o.id = j.result_s3_object_id),
        'metrics', j.metrics
    )
$$;

-- A file, its current job, every attempt in attempt order and every retry of it, as one
-- JSON document; NULL when there is no such file. A file moved to the archive
-- (arm.archive_files) is read from there, with when it was moved (`archived_at`; NULL for
-- a file in the hot tables). PL/pgSQL, whose body names tables only when it runs: the
-- function files also run on databases older than the archive's tables.
CREATE OR REPLACE FUNCTION arm.get_file(p_file_id uuid)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    RETURN (
    WITH hot AS (
        SELECT f, NULL::timestamptz AS archived_at FROM arm.stored_file f WHERE f.id = p_file_id
    ),
    one AS (
        SELECT * FROM hot
        UNION ALL
        SELECT jsonb_populate_record(NULL::arm.stored_file, to_jsonb(a)), a.archived_at
        FROM arm.archived_file a
        WHERE a.id = p_file_id AND NOT EXISTS (SELECT FROM hot)
    ),
    jobs AS (
        SELECT j FROM arm.recognition_job j WHERE j.file_id = p_file_id
        UNION ALL
        SELECT jsonb_populate_record(NULL::arm.recognition_job, to_jsonb(a))
        FROM arm.archived_job a WHERE a.file_id = p_file_id
    ),
    -- The retry audit (arm.retry_audit, written by retry_file_v3): who retried, with
    -- which access level (NULL: none recorded, a DBA's SQL or an older retry), when, from
    -- which job to which.
    retries AS (
        SELECT a.id, a.actor, a.actor_level, a.retried_at, a.old_job_id, a.new_job_id,
               a.new_attempt
        FROM arm.retry_audit a WHERE a.file_id = p_file_id
        UNION ALL
        SELECT a.id, a.actor, a.actor_level, a.retried_at, a.old_job_id, a.new_job_id,
               a.new_attempt
        FROM arm.archived_retry_audit a WHERE a.file_id = p_file_id
    )
    SELECT jsonb_build_object(
        'file', jsonb_build_object(
            'id', (one.f).id,
            'consolidation_id', (one.f).consolidation_id,
            'original_name', (one.f).original_name,
            'file_type', (one.f).file_type,
            'status', (one.f).status,
            's3', jsonb_build_object('bucket', o.bucket, 'key', o.key),
            'current_job_id', (one.f).current_recognition_job_id,
            'created_at', (one.f).created_at,
            'updated_at', (one.f).updated_at,
            'archived_at', one.archived_at
        ),
        'current_job', (SELECT arm.job_view(jobs.j) FROM jobs
                        WHERE (jobs.j).id = (one.f).current_recognition_job_id),
        'attempts', coalesce((SELECT jsonb_agg(arm.job_view(jobs.j) ORDER BY (jobs.j).attempt)
                              FROM jobs), '[]'::jsonb),
        -- Oldest first.
        'retries', coalesce((SELECT jsonb_agg(jsonb_build_object(
                                 'actor', r.actor,
                                 'actor_level', r.actor_level,
                                 'retried_at', r.retried_at,
                                 'old_job_id', r.old_job_id,
                                 'new_job_id', r.new_job_id,
                                 'new_attempt', r.new_attempt) ORDER BY r.retried_at, r.id)
                             FROM retries r), '[]'::jsonb)
    )
    FROM one
    JOIN arm.s3_object o ON o.id = (one.f).s3_object_id
    );
END;
$$;
