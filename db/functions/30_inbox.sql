-- The inbox's side (R-ACK-1, R-IN-1): acks and results from files.tabular_parsed.
-- Both lock the job row by id first and decide on what they then see. A status filter
-- in the UPDATE's WHERE would not do: under READ COMMITTED a row whose visible version
-- is still `queued` (the publisher's transaction has not committed yet) is skipped
-- without waiting, and an early ack would be lost. SELECT … FOR UPDATE by id waits for
-- the publisher's commit and returns the row as it committed.
--
-- Outcomes (returned, never raised, so the caller can log them):
--   applied        the transition happened
--   duplicate      the same ack/result was applied before; nothing changed
--   already_final  the job is final (a late answer, e.g. of an attempt that timed out)
--   not_published  the job is still queued (it was never sent)
--   unknown_job    no job has this id
--   file_mismatch  the envelope's file_id is not the job's

-- Applies an ack (`status = processing`): published → processing with started_at and the
-- service; the file becomes PROCESSING when this job is its current one.
CREATE OR REPLACE FUNCTION arm.apply_ack(
    p_job_id uuid,
    p_file_id uuid,
    p_service_name text,
    p_service_version text
)
RETURNS TABLE (outcome text, attempt integer, status arm.job_status)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    j arm.recognition_job;
BEGIN
    SELECT * INTO j FROM arm.recognition_job WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown_job', NULL::integer, NULL::arm.job_status;
        RETURN;
    END IF;
    IF p_file_id IS DISTINCT FROM j.file_id THEN
        RETURN QUERY SELECT 'file_mismatch', j.attempt, j.status;
    ELSIF j.status = 'processing' THEN
        RETURN QUERY SELECT 'duplicate', j.attempt, j.status;
    ELSIF arm.is_final(j.status) THEN
        RETURN QUERY SELECT 'already_final', j.attempt, j.status;
    ELSIF j.status = 'queued' THEN
        RETURN QUERY SELECT 'not_published', j.attempt, j.status;
    ELSE
        UPDATE arm.recognition_job
        SET status = 'processing',
            started_at = clock_timestamp(),
            service_name = p_service_name,
            service_version = p_service_version
        WHERE id = j.id;
        UPDATE arm.stored_file
        SET status = 'PROCESSING'
        WHERE id = j.file_id
          AND current_recognition_job_id = j.id
          AND status <> 'PROCESSING';
        RETURN QUERY SELECT 'applied', j.attempt, 'processing'::arm.job_status;
    END IF;
END;
$$;

-- Applies a result (`done`, `needs_check` or `error`) in one transaction: registers the
-- result file in s3_object (role results, created_by = the service) when one is given,
-- and records status, service, finished_at, metrics, error, result schema version,
-- result object and the message's Nats-Msg-Id on the job. A message whose id equals the
-- job's result_msg_id changes nothing. `error` makes the file ERROR; done/needs_check
-- leave it PROCESSING for mapping (both only when this job is the file's current one).
-- The result file itself is never read.
CREATE OR REPLACE FUNCTION arm.apply_result(
    p_job_id uuid,
    p_file_id uuid,
    p_msg_id text,
    p_status arm.job_status,
    p_service_name text,
    p_service_version text,
    p_result_bucket text DEFAULT NULL,
    p_result_key text DEFAULT NULL,
    p_result_schema_version text DEFAULT NULL,
    p_error_code text DEFAULT NULL,
    p_error_message text DEFAULT NULL,
    p_metrics jsonb DEFAULT NULL
)
RETURNS TABLE (outcome text, attempt integer, status arm.job_status)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    j arm.recognition_job;
    v_object_id uuid;
BEGIN
    IF p_status NOT IN ('done', 'needs_check', 'error') THEN
        RAISE EXCEPTION 'apply_result takes done, needs_check or error, not %', p_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_msg_id IS NULL OR p_msg_id = '' THEN
        RAISE EXCEPTION 'apply_result needs the message''s Nats-Msg-Id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_status = 'error' AND p_error_code IS NULL THEN
        RAISE EXCEPTION 'an error result needs an error code' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_status IN ('done', 'needs_check')
       AND (p_result_bucket IS NULL OR p_result_key IS NULL OR p_result_schema_version IS NULL) THEN
        RAISE EXCEPTION 'a % result needs result_s3 and result_schema_version', p_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT * INTO j FROM arm.recognition_job WHERE id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown_job', NULL::integer, NULL::arm.job_status;
        RETURN;
    END IF;
    IF p_file_id IS DISTINCT FROM j.file_id THEN
        RETURN QUERY SELECT 'file_mismatch', j.attempt, j.status;
        RETURN;
    END IF;
    IF j.result_msg_id = p_msg_id THEN
        RETURN QUERY SELECT 'duplicate', j.attempt, j.status;
        RETURN;
    END IF;
    IF arm.is_final(j.status) THEN
        RETURN QUERY SELECT 'already_final', j.attempt, j.status;
        RETURN;
    END IF;
    IF j.status = 'queued' THEN
        RETURN QUERY SELECT 'not_published', j.attempt, j.status;
        RETURN;
    END IF;

    IF p_result_bucket IS NOT NULL AND p_result_key IS NOT NULL THEN
        INSERT INTO arm.s3_object (bucket, key, bucket_role, created_by)
        VALUES (p_result_bucket, p_result_key, 'results', p_service_name)
        RETURNING id INTO v_object_id;
    END IF;

    UPDATE arm.recognition_job
    SET status = p_status,
        service_name = p_service_name,
        service_version = p_service_version,
        finished_at = clock_timestamp(),
        metrics = p_metrics,
        error_code = CASE WHEN p_status = 'error' THEN p_error_code END,
        error_message = CASE WHEN p_status = 'error' THEN p_error_message END,
        result_schema_version = p_result_schema_version,
        result_s3_object_id = v_object_id,
        result_msg_id = p_msg_id
    WHERE id = j.id;

    UPDATE arm.stored_file
    SET status = CASE WHEN p_status = 'error' THEN 'ERROR' ELSE 'PROCESSING' END::arm.file_status
    WHERE id = j.file_id
      AND current_recognition_job_id = j.id;

    RETURN QUERY SELECT 'applied', j.attempt, p_status;
END;
$$;
