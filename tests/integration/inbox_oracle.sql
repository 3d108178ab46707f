-- The oracle of tests/integration/test_inbox_batch_equivalence.py: the inbox's rule
-- written the plain way, one envelope per call, each call locking its job by id and
-- deciding on what it then sees (it waits for a lock, where arm.apply_envelopes_v2
-- answers `busy`). arm.apply_envelopes_v2 must give, element by element, the outcomes
-- and leave the state that calling this for each element of its batch in turn gives; the
-- test compares the two on random and edge batches. It takes an envelope as
-- arm.apply_envelopes_v2 takes each element (the same JSON object), so a new field of
-- the result is one more line here, in its UPDATE, and none in the test.
--
-- The test creates schema arm_oracle in its own clone of the test database, beside arm,
-- which it leaves as migrate made it. Until migration 0017 this rule was arm.apply_ack
-- and arm.apply_result, which the bridges of 0.1.0 called.
--
-- What an envelope does and its outcomes: db/functions/30_inbox.sql.

CREATE SCHEMA arm_oracle;

CREATE FUNCTION arm_oracle.apply_envelope(p_env jsonb)
RETURNS TABLE (outcome text, attempt integer, status arm.job_status)
LANGUAGE plpgsql
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job_id uuid := (p_env ->> 'job_id')::uuid;
    v_file_id uuid := (p_env ->> 'file_id')::uuid;
    v_msg_id text := p_env ->> 'msg_id';
    v_status text := p_env ->> 'status';
    v_problem text;
    v_object_id uuid;
    j arm.recognition_job;
BEGIN
    v_problem := arm.envelope_problem(v_status, v_msg_id, p_env ->> 'error_code',
                                      p_env ->> 'result_bucket', p_env ->> 'result_key',
                                      p_env ->> 'result_schema_version');
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'apply_result: the answer %', v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT * INTO j FROM arm.recognition_job WHERE id = v_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown_job', NULL::integer, NULL::arm.job_status;
        RETURN;
    END IF;
    IF v_file_id IS DISTINCT FROM j.file_id THEN
        RETURN QUERY SELECT 'file_mismatch', j.attempt, j.status;
        RETURN;
    END IF;

    IF v_status = 'processing' THEN
        -- An ack.
        IF j.status = 'processing' THEN
            RETURN QUERY SELECT 'duplicate', j.attempt, j.status;
        ELSIF arm.is_final(j.status) THEN
            RETURN QUERY SELECT 'already_final', j.attempt, j.status;
        ELSIF j.status = 'queued' THEN
            RETURN QUERY SELECT 'not_published', j.attempt, j.status;
        ELSE
            UPDATE arm.recognition_job
            SET status = 'processing',
                started_at = clock_timestamp(),
                service_name = p_env ->> 'service_name',
                service_version = p_env ->> 'service_version'
            WHERE id = j.id;
            UPDATE arm.stored_file
            SET status = 'PROCESSING'
            WHERE id = j.file_id
              AND current_recognition_job_id = j.id
              AND status <> 'PROCESSING';
            RETURN QUERY SELECT 'applied', j.attempt, 'processing'::arm.job_status;
        END IF;
        RETURN;
    END IF;

    -- A result.
    IF j.result_msg_id = v_msg_id THEN
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

    IF p_env ->> 'result_bucket' IS NOT NULL AND p_env ->> 'result_key' IS NOT NULL THEN
        INSERT INTO arm.s3_object (bucket, key, bucket_role, created_by)
        VALUES (p_env ->> 'result_bucket', p_env ->> 'result_key', 'results',
                p_env ->> 'service_name')
        RETURNING id INTO v_object_id;
    END IF;

    UPDATE arm.recognition_job
    SET status = v_status::arm.job_status,
        service_name = p_env ->> 'service_name',
        service_version = p_env ->> 'service_version',
        finished_at = clock_timestamp(),
        metrics = nullif(p_env -> 'metrics', 'null'::jsonb),
        error_code = CASE WHEN v_status = 'error' THEN p_env ->> 'error_code' END,
        error_message = CASE WHEN v_status = 'error' THEN p_env ->> 'error_message' END,
        result_schema_version = p_env ->> 'result_schema_version',
        result_s3_object_id = v_object_id,
        result_msg_id = v_msg_id
    WHERE id = j.id;

    UPDATE arm.stored_file
    SET status = CASE WHEN v_status = 'error' THEN 'ERROR' ELSE 'PROCESSING' END::arm.file_status
    WHERE id = j.file_id
      AND current_recognition_job_id = j.id;

    RETURN QUERY SELECT 'applied', j.attempt, v_status::arm.job_status;
END;
$$;
