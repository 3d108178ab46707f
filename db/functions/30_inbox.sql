-- The inbox's side (R-ACK-1, R-IN-1): acks and results from files.tabular_parsed,
-- applied one at a time (apply_ack, apply_result) or as a batch in one transaction
-- (apply_envelopes, which calls them). Both lock the job row by id first and decide on
-- what they then see. A status filter
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
--   busy           (apply_envelopes only) another transaction holds the job's row:
--                  nothing was done, the caller applies the envelope again

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

-- Applies a batch of envelopes in the caller's one transaction (so a batch is one commit),
-- in array order, with exactly the outcomes of apply_ack and apply_result, which it calls
-- for each element. p_envelopes is a JSON array of objects with the keys job_id, file_id,
-- msg_id, status ('processing' = an ack; 'done' | 'needs_check' | 'error' = a result),
-- service_name, service_version, result_bucket, result_key, result_schema_version,
-- error_code, error_message and metrics (an object or null); unused keys may be null or
-- absent. Returns one row per element: ord (its 1-based position), outcome, attempt, status.
-- A later element sees what the earlier ones did: a second copy of an ack, or of a result
-- with the same msg_id, gets `duplicate`; an ack after its job's result gets `already_final`.
--
-- Locks: before applying anything it locks the job rows the batch names, in id order,
-- with SKIP LOCKED. Every element whose job exists but is locked by another transaction
-- — typically a publisher whose claim + mark_published has not committed yet, when the
-- ack came back faster than that commit, or another bridge's batch — gets the outcome
-- `busy` and is NOT applied: the caller applies it again in its next batch, before
-- anything that arrived later, so the order per job holds. All elements of a busy job
-- are busy, so none of its envelopes overtakes another. This way a batch never waits
-- for a publisher's NATS round trip (the batch would otherwise stall on the slowest
-- lock it meets), and two bridges applying overlapping batches never deadlock: nothing
-- here waits for a job lock. The elements then lock only rows it already holds, plus
-- files (UPDATE … WHERE current_recognition_job_id = the job).
-- An early ack is therefore never lost: it is `busy` until the publisher commits, then
-- applied. (Every job an envelope names committed before its request went out, so the
-- locking statement sees it once that commit is there.)
--
-- Errors: there is deliberately no exception block per element. Each PL/pgSQL exception
-- block is a subtransaction, and more than 64 subtransactions that write in one
-- transaction overflow the backend's subxid cache, after which every other session's
-- snapshots get slower. So an element that raises (a malformed envelope refused by
-- apply_result's invalid_parameter_value checks, an unknown status, a constraint such as
-- a result key over 1024 characters) fails the whole call and nothing of the batch is
-- applied. The caller then rolls back and applies that batch again one element per call,
-- which gives the bad element its own error and the others their outcomes.
CREATE OR REPLACE FUNCTION arm.apply_envelopes(p_envelopes jsonb)
RETURNS TABLE (ord integer, outcome text, attempt integer, status arm.job_status)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    e record;
    r record;
    v_named uuid[];
    v_locked uuid[];
BEGIN
    IF jsonb_typeof(p_envelopes) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'apply_envelopes takes a JSON array of envelopes, not %',
            coalesce(jsonb_typeof(p_envelopes), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    v_named := ARRAY(SELECT DISTINCT (x.env ->> 'job_id')::uuid
                     FROM jsonb_array_elements(p_envelopes) AS x(env));
    v_locked := ARRAY(SELECT j.id FROM arm.recognition_job j
                      WHERE j.id = ANY (v_named)
                      ORDER BY j.id
                      FOR UPDATE SKIP LOCKED);

    FOR e IN
        SELECT x.n::integer AS n, x.env,
               (x.env ->> 'job_id')::uuid AS job_id,
               (x.env ->> 'file_id')::uuid AS file_id,
               x.env ->> 'status' AS status
        FROM jsonb_array_elements(p_envelopes) WITH ORDINALITY AS x(env, n)
        ORDER BY x.n
    LOOP
        IF e.status IN ('processing', 'done', 'needs_check', 'error')
           AND e.job_id <> ALL (v_locked)
           AND EXISTS (SELECT 1 FROM arm.recognition_job j WHERE j.id = e.job_id) THEN
            -- Locked by someone else: applied by the caller's next batch.
            ord := e.n;
            outcome := 'busy';
            attempt := NULL;
            status := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF e.status = 'processing' THEN
            SELECT a.outcome, a.attempt, a.status INTO r
            FROM arm.apply_ack(e.job_id, e.file_id,
                               e.env ->> 'service_name', e.env ->> 'service_version') AS a;
        ELSIF e.status IN ('done', 'needs_check', 'error') THEN
            SELECT a.outcome, a.attempt, a.status INTO r
            FROM arm.apply_result(
                p_job_id => e.job_id,
                p_file_id => e.file_id,
                p_msg_id => e.env ->> 'msg_id',
                p_status => e.status::arm.job_status,
                p_service_name => e.env ->> 'service_name',
                p_service_version => e.env ->> 'service_version',
                p_result_bucket => e.env ->> 'result_bucket',
                p_result_key => e.env ->> 'result_key',
                p_result_schema_version => e.env ->> 'result_schema_version',
                p_error_code => e.env ->> 'error_code',
                p_error_message => e.env ->> 'error_message',
                p_metrics => nullif(e.env -> 'metrics', 'null'::jsonb)
            ) AS a;
        ELSE
            RAISE EXCEPTION 'apply_envelopes: element % has status %, not processing, done, '
                            'needs_check or error', e.n, coalesce(e.status, 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        ord := e.n;
        outcome := r.outcome;
        attempt := r.attempt;
        status := r.status;
        RETURN NEXT;
    END LOOP;
END;
$$;
