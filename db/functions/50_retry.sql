-- Manual retry: a new attempt of a file (R-RT-1…3). Checking the file's current job and
-- the attempt limit, creating the new attempt, switching the file and writing the audit
-- record happen in one transaction under the file's row lock, so two retries of the
-- same failed attempt never create two jobs: the second waits for the first, then sees
-- the new queued attempt and is refused (not_failed). A rollback takes the new job, the
-- switch and the audit record back together.
--
-- Lock order: retry locks only the file (and creates a row nobody else can see yet);
-- it reads the current job without locking it. Final jobs never change, and a live job
-- makes the file not retryable either way, so that read cannot go stale in a way that
-- matters, and a retry of one file cannot deadlock with the inbox or the sweep (which
-- lock the job, then the file). A retry of many files (retry_files_v3) can: it holds the
-- files it has passed while it waits for the next, and a batch of the inbox updates its
-- files in no set order. PostgreSQL then rolls one of the two back; the API's store and
-- the bridge's send that call again (src/arm_core/store.py), a DBA's SQL sees the
-- error (40P01) and runs it again.
--
-- Outcomes: retried | not_found | not_retryable, with a reason for not_retryable:
--   not_failed          the current job is live (queued, published, processing) or
--                       succeeded (done, needs_check)
--   attempts_exhausted  the current job failed but attempt = max_attempts
--   no_job              the file has no recognition job yet
--   archived            the file was moved to the archive (arm.archive_files); its last
--                       attempt is in previous_*
--   attempt_changed     the caller named the job it saw (p_expected_job_id) and the
--                       file's current job is another one now: a second click, or a
--                       second operator, after the first retry's attempt already failed
--                       (two requests against the same failed attempt never create
--                       two new jobs). The current job is in previous_*.

-- Retries one file on behalf of p_actor, who retried with the access level p_actor_level,
-- when its current job is still p_expected_job_id (the attempt the caller saw; NULL:
-- whichever it is now). Same guarantees as the HTTP API, which always names the job when
-- the caller does, and always gives the level of its credential: `operator`, or `all`
-- for one that holds every level (src/arm_core/access.py). The audit record keeps both;
-- NULL (a DBA's SQL, the older names below) records no level. Any other level is refused
-- before anything is read or written.
CREATE OR REPLACE FUNCTION arm.retry_file_v3(
    p_file_id uuid, p_actor text, p_expected_job_id uuid, p_actor_level text
)
RETURNS TABLE (
    file_id uuid,
    outcome text,
    reason text,
    job_id uuid,
    attempt integer,
    previous_job_id uuid,
    previous_status arm.job_status,
    previous_attempt integer,
    max_attempts integer
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    f arm.stored_file;
    j arm.recognition_job;
    v_new_id uuid;
BEGIN
    IF p_actor IS NULL OR btrim(p_actor) = '' THEN
        RAISE EXCEPTION 'retry_file needs an actor (who retries)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_actor_level NOT IN ('operator', 'all') THEN
        RAISE EXCEPTION 'retry_file: p_actor_level must be operator, all or NULL (the level the actor retried with), not %',
            quote_literal(p_actor_level)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT * INTO f FROM arm.stored_file WHERE id = p_file_id FOR UPDATE;
    IF NOT FOUND THEN
        -- Moved to the archive (arm.archive_files), perhaps while this call waited for the
        -- file's lock: its history is kept, read-only; a new upload is a new file.
        RETURN QUERY SELECT p_file_id, 'not_retryable', 'archived',
            NULL::uuid, NULL::integer, aj.id, aj.status, aj.attempt, aj.max_attempts
        FROM arm.archived_file af
        LEFT JOIN arm.archived_job aj ON aj.id = af.current_recognition_job_id
        WHERE af.id = p_file_id;
        IF FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY SELECT p_file_id, 'not_found', 'file_not_found',
            NULL::uuid, NULL::integer, NULL::uuid, NULL::arm.job_status, NULL::integer,
            NULL::integer;
        RETURN;
    END IF;

    SELECT * INTO j FROM arm.recognition_job WHERE id = f.current_recognition_job_id;
    IF p_expected_job_id IS NOT NULL
       AND p_expected_job_id IS DISTINCT FROM f.current_recognition_job_id THEN
        RETURN QUERY SELECT f.id, 'not_retryable', 'attempt_changed',
            NULL::uuid, NULL::integer, j.id, j.status, j.attempt, j.max_attempts;
        RETURN;
    END IF;
    IF NOT FOUND THEN
        RETURN QUERY SELECT f.id, 'not_retryable', 'no_job',
            NULL::uuid, NULL::integer, NULL::uuid, NULL::arm.job_status, NULL::integer,
            NULL::integer;
        RETURN;
    END IF;
    IF j.status NOT IN ('timeout', 'dlq', 'error') THEN
        RETURN QUERY SELECT f.id, 'not_retryable', 'not_failed',
            NULL::uuid, NULL::integer, j.id, j.status, j.attempt, j.max_attempts;
        RETURN;
    END IF;
    IF j.attempt >= j.max_attempts THEN
        RETURN QUERY SELECT f.id, 'not_retryable', 'attempts_exhausted',
            NULL::uuid, NULL::integer, j.id, j.status, j.attempt, j.max_attempts;
        RETURN;
    END IF;

    -- In the file's lane: a retry counts as its consolidation's (22_pacing.sql).
    INSERT INTO arm.recognition_job (file_id, pipeline, attempt, max_attempts, status, requested_at,
                                     lane)
    VALUES (f.id, j.pipeline, j.attempt + 1, j.max_attempts, 'queued', clock_timestamp(),
            coalesce(f.consolidation_id, '00000000-0000-0000-0000-000000000000'))
    RETURNING id INTO v_new_id;

    UPDATE arm.stored_file
    SET current_recognition_job_id = v_new_id,
        status = 'UPLOADED'
    WHERE id = f.id;

    INSERT INTO arm.retry_audit
        (file_id, old_job_id, new_job_id, new_attempt, actor, actor_level)
    VALUES (f.id, j.id, v_new_id, j.attempt + 1, p_actor, p_actor_level);

    RETURN QUERY SELECT f.id, 'retried', NULL::text,
        v_new_id, j.attempt + 1, j.id, j.status, j.attempt, j.max_attempts;
END;
$$;

-- retry_file_v3 without a level: the audit records none (the previous release's API
-- calls it; a DBA may).
CREATE OR REPLACE FUNCTION arm.retry_file_v2(
    p_file_id uuid, p_actor text, p_expected_job_id uuid
)
RETURNS TABLE (
    file_id uuid,
    outcome text,
    reason text,
    job_id uuid,
    attempt integer,
    previous_job_id uuid,
    previous_status arm.job_status,
    previous_attempt integer,
    max_attempts integer
)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    SELECT * FROM arm.retry_file_v3(p_file_id, p_actor, p_expected_job_id, NULL)
$$;

-- Retries one file whatever its current job is: retry_file_v3 without an expectation or
-- a level (an older release's API calls it; a DBA may).
CREATE OR REPLACE FUNCTION arm.retry_file(p_file_id uuid, p_actor text)
RETURNS TABLE (
    file_id uuid,
    outcome text,
    reason text,
    job_id uuid,
    attempt integer,
    previous_job_id uuid,
    previous_status arm.job_status,
    previous_attempt integer,
    max_attempts integer
)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    SELECT * FROM arm.retry_file_v3(p_file_id, p_actor, NULL, NULL)
$$;

-- Retries many files in one transaction, one result row per distinct file id (NULLs
-- ignored); p_expected_job_ids[i] is the job the caller saw for p_file_ids[i] (NULL, or
-- a shorter or NULL array: whichever; a file named twice keeps its first). A file that
-- cannot be retried is reported, the rest go on. Files are locked in id order, so
-- concurrent retries with overlapping files cannot deadlock with each other (with a
-- batch of the inbox they can: above). p_actor_level is recorded
-- for every file retried; retry_file_v3 checks it first thing, so a bad one fails the
-- whole batch at its first file, having written nothing.
CREATE OR REPLACE FUNCTION arm.retry_files_v3(
    p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[], p_actor_level text
)
RETURNS TABLE (
    file_id uuid,
    outcome text,
    reason text,
    job_id uuid,
    attempt integer,
    previous_job_id uuid,
    previous_status arm.job_status,
    previous_attempt integer,
    max_attempts integer
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id uuid;
    v_expected uuid;
BEGIN
    FOR v_id, v_expected IN
        SELECT DISTINCT ON (u.id) u.id, u.expected
        FROM unnest(p_file_ids, coalesce(p_expected_job_ids, '{}'::uuid[]))
             WITH ORDINALITY AS u(id, expected, n)
        WHERE u.id IS NOT NULL
        ORDER BY u.id, u.n
    LOOP
        RETURN QUERY SELECT * FROM arm.retry_file_v3(v_id, p_actor, v_expected, p_actor_level);
    END LOOP;
END;
$$;

-- retry_files_v3 without a level: the audit records none (the previous release's API
-- calls it; a DBA may).
CREATE OR REPLACE FUNCTION arm.retry_files_v2(
    p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[]
)
RETURNS TABLE (
    file_id uuid,
    outcome text,
    reason text,
    job_id uuid,
    attempt integer,
    previous_job_id uuid,
    previous_status arm.job_status,
    previous_attempt integer,
    max_attempts integer
)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    SELECT * FROM arm.retry_files_v3(p_file_ids, p_actor, p_expected_job_ids, NULL)
$$;

-- retry_files_v3 without expectations or a level (an older release's API; a DBA).
CREATE OR REPLACE FUNCTION arm.retry_files(p_file_ids uuid[], p_actor text)
RETURNS TABLE (
    file_id uuid,
    outcome text,
    reason text,
    job_id uuid,
    attempt integer,
    previous_job_id uuid,
    previous_status arm.job_status,
    previous_attempt integer,
    max_attempts integer
)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    SELECT * FROM arm.retry_files_v3(p_file_ids, p_actor, NULL, NULL)
$$;
