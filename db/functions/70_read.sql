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
-- JSON document; NULL when there is no such file.
CREATE OR REPLACE FUNCTION arm.get_file(p_file_id uuid)
RETURNS jsonb
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    SELECT jsonb_build_object(
        'file', jsonb_build_object(
            'id', f.id,
            'consolidation_id', f.consolidation_id,
            'original_name', f.original_name,
            'file_type', f.file_type,
            'status', f.status,
            's3', jsonb_build_object('bucket', o.bucket, 'key', o.key),
            'current_job_id', f.current_recognition_job_id,
            'created_at', f.created_at,
            'updated_at', f.updated_at
        ),
        'current_job', (SELECT arm.job_view(j) FROM arm.recognition_job j
                        WHERE j.id = f.current_recognition_job_id),
        'attempts', coalesce((SELECT jsonb_agg(arm.job_view(j) ORDER BY j.attempt)
                              FROM arm.recognition_job j WHERE j.file_id = f.id), '[]'::jsonb),
        -- The retry audit (arm.retry_audit, written by retry_file): who retried when, from
        -- which job to which, oldest first.
        'retries', coalesce((SELECT jsonb_agg(jsonb_build_object(
                                 'actor', a.actor,
                                 'retried_at', a.retried_at,
                                 'old_job_id', a.old_job_id,
                                 'new_job_id', a.new_job_id,
                                 'new_attempt', a.new_attempt) ORDER BY a.retried_at, a.id)
                             FROM arm.retry_audit a WHERE a.file_id = f.id), '[]'::jsonb)
    )
    FROM arm.stored_file f
    JOIN arm.s3_object o ON o.id = f.s3_object_id
    WHERE f.id = p_file_id
$$;
