-- The inbox's side (R-ACK-1, R-IN-1): acks and results from files.tabular_parsed,
-- applied as a batch in one transaction (apply_envelopes_v2; the bridge's fallback sends
-- one envelope a call). It locks the job rows by id first and decides on what it then
-- sees. A status filter in the UPDATE's WHERE would not do: under READ COMMITTED a row
-- whose visible version is still `queued` (the publisher's transaction has not committed
-- yet) is skipped without waiting, and an early ack would be lost.
--
-- What an envelope does:
--   an ack (`status = processing`): published → processing with started_at and the
--     service; the file becomes PROCESSING when this job is its current one;
--   a result (`done`, `needs_check` or `error`): registers the result file in s3_object
--     (role results, created_by = the service) when one is given, and records status,
--     service, finished_at, metrics, error, result schema version, result object and the
--     message's Nats-Msg-Id on the job. A message whose id equals the job's result_msg_id
--     changes nothing. `error` makes the file ERROR; done/needs_check leave it PROCESSING
--     for mapping (both only when this job is the file's current one). The result file
--     itself is never read.
--
-- Outcomes (returned, never raised, so the caller can log them):
--   applied        the transition happened
--   duplicate      the same ack/result was applied before; nothing changed
--   already_final  the job is final (a late answer, e.g. of an attempt that timed out)
--   not_published  the job is still queued (it was never sent)
--   unknown_job    no job has this id
--   file_mismatch  the envelope's file_id is not the job's
--   busy           another transaction holds the job's row: nothing was done, the
--                  caller applies the envelope again

-- Applies a batch of envelopes in the caller's one transaction (so a batch is one commit),
-- in array order, with exactly the outcomes and effects that applying each element alone,
-- in turn, would have (tests/integration/test_inbox_batch_equivalence.py compares the two
-- on random batches, against that rule written one envelope per call in
-- tests/integration/inbox_oracle.sql). p_envelopes is a
-- JSON array of objects with the keys job_id, file_id, msg_id, status ('processing' = an
-- ack; 'done' | 'needs_check' | 'error' = a result), service_name, service_version,
-- result_bucket, result_key, result_schema_version, error_code, error_message and metrics
-- (an object or null); unused keys may be null or absent. Returns one row per element:
-- ord (its 1-based position), outcome, attempt, status (the job's status once that
-- element is through) and, for an applied element, wait_seconds: the wait it ended, for
-- the histogram arm_job_wait_seconds{phase} — an ack (→ processing) published_at →
-- started_at, a result (→ done | needs_check | error) started_at → finished_at (NULL
-- when the job was never acked); both as the batch's UPDATE of the job RETURNs them.
-- A later element sees what the earlier ones did: a second copy of an ack, or of a
-- result with the same msg_id, gets `duplicate`; an ack after its job's result gets
-- `already_final`.
--
-- _v2: the first version had no wait_seconds (a new result column is a new name,
-- db/README.md). No release called it; migration 0007 drops it.
--
-- Set-based, not a loop: per job, the first ack (if the job was published) and the first
-- result (if the job was live) are the only elements that change anything; every other
-- element's outcome follows from where it stands relative to those two. So the whole
-- batch is one statement: one UPDATE of the jobs (an ack and a result of the same job in
-- one batch become one row version, published → done), one INSERT of the result
-- objects, one UPDATE of the files. A loop applying one envelope per call cost about
-- 120 µs an envelope, which made the inbox the slowest part of a burst.
--
-- Locks: before applying anything it locks the job rows the batch names, in id order,
-- with SKIP LOCKED. Every element whose job exists but is locked by another transaction
-- — typically a publisher whose publish_queued_jobs_v2 has not committed yet, when the
-- ack came back faster than that commit, or another bridge's batch — gets the outcome
-- `busy` and is NOT applied: the caller applies it again in its next batch, before
-- anything that arrived later, so the order per job holds. All elements of a busy job
-- are busy, so none of its envelopes overtakes another. This way a batch never waits
-- for a publisher's NATS round trip (the batch would otherwise stall on the slowest
-- lock it meets), and two bridges applying overlapping batches never deadlock: nothing
-- here waits for a job lock. Files are then updated only for jobs it holds (WHERE
-- current_recognition_job_id = the job).
-- An early ack is therefore never lost: it is `busy` until the publisher commits, then
-- applied. (Every job an envelope names committed before its request went out, so the
-- locking statement sees it once that commit is there.)
--
-- Errors: an element the inbox refuses (arm.envelope_problem: no msg_id; an
-- error without a code; a done/needs_check without result_s3 or result_schema_version;
-- an unknown status), or a constraint (a result key over 1024 characters) fails the
-- whole call, and nothing of the batch is applied. The caller then applies that batch again one element per call,
-- which gives the bad element its own error and the others their outcomes. There is
-- deliberately no exception block per element: each is a subtransaction, and more than
-- 64 subtransactions that write in one transaction overflow the backend's subxid cache,
-- after which every other session's snapshots get slower.
CREATE OR REPLACE FUNCTION arm.apply_envelopes_v2(p_envelopes jsonb)
RETURNS TABLE (
    ord integer,
    outcome text,
    attempt integer,
    status arm.job_status,
    wait_seconds double precision
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_named uuid[];
    v_locked uuid[];
    v_bad record;
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    IF jsonb_typeof(p_envelopes) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'apply_envelopes takes a JSON array of envelopes, not %',
            coalesce(jsonb_typeof(p_envelopes), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- What the inbox refuses, checked for the whole batch first (arm.envelope_problem is
    -- inlined here: one expression per element).
    SELECT b.n, b.problem
    INTO v_bad
    FROM (SELECT x.n,
                 arm.envelope_problem(x.env ->> 'status', x.env ->> 'msg_id',
                                      x.env ->> 'error_code', x.env ->> 'result_bucket',
                                      x.env ->> 'result_key',
                                      x.env ->> 'result_schema_version') AS problem
          FROM jsonb_array_elements(p_envelopes) WITH ORDINALITY AS x(env, n)) b
    WHERE b.problem IS NOT NULL
    ORDER BY b.n
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'apply_envelopes: element % %', v_bad.n, v_bad.problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Every job the batch names, then those of them this call holds. The jobs are read
    -- by primary key (id = ANY of an array, whose length the planner knows or, in the
    -- generic plan, takes as small): joined to the envelopes as a set, the planner
    -- expected a hundred of them and hashed all of recognition_job, final jobs included,
    -- twice per batch — a batch's cost grew with the history.
    v_named := ARRAY(SELECT DISTINCT (x.env ->> 'job_id')::uuid
                     FROM jsonb_array_elements(p_envelopes) AS x(env));
    v_locked := ARRAY(SELECT j.id FROM arm.recognition_job j
                      WHERE j.id = ANY (v_named)
                      ORDER BY j.id
                      FOR UPDATE SKIP LOCKED);

    RETURN QUERY
    WITH e AS (
        SELECT x.n::integer AS n, x.env,
               (x.env ->> 'job_id')::uuid AS job_id,
               (x.env ->> 'file_id')::uuid AS file_id,
               x.env ->> 'msg_id' AS msg_id,
               x.env ->> 'status' = 'processing' AS is_ack,
               j.id IS NOT NULL AS found,
               j.id = ANY (v_locked) AS held,
               j.file_id AS job_file_id, j.attempt AS job_attempt,
               j.status AS s0, j.result_msg_id AS m0
        FROM jsonb_array_elements(p_envelopes) WITH ORDINALITY AS x(env, n)
        LEFT JOIN arm.recognition_job j
               ON j.id = (x.env ->> 'job_id')::uuid AND j.id = ANY (v_named)
    ), c AS (
        -- Elements that act on their job: found, held, same file, the job not queued.
        SELECT e.*,
               e.found AND e.held AND e.file_id IS NOT DISTINCT FROM e.job_file_id
               AND e.s0 <> 'queued' AS acts
        FROM e
    ), first_result AS (
        -- The result that finishes a live job; arm.uuid_v7() (volatile) keeps this CTE
        -- evaluated once, so its object id is the same wherever it is read.
        SELECT DISTINCT ON (c.job_id)
               c.job_id, c.n AS r_n, c.env AS r_env, c.msg_id AS r_msg,
               (c.env ->> 'status')::arm.job_status AS r_status,
               CASE WHEN c.env ->> 'result_bucket' IS NOT NULL
                         AND c.env ->> 'result_key' IS NOT NULL
                    THEN arm.uuid_v7() END AS object_id
        FROM c
        WHERE c.acts AND NOT c.is_ack AND c.s0 IN ('published', 'processing')
        ORDER BY c.job_id, c.n
    ), first_ack AS (
        -- The ack that starts a published job: the first one, if before its result.
        SELECT DISTINCT ON (c.job_id) c.job_id, c.n AS a_n, c.env AS a_env
        FROM c
        LEFT JOIN first_result r ON r.job_id = c.job_id
        WHERE c.acts AND c.is_ack AND c.s0 = 'published' AND (r.r_n IS NULL OR c.n < r.r_n)
        ORDER BY c.job_id, c.n
    ), changed AS (
        SELECT c.job_id, c.job_file_id, a.a_n, a.a_env, r.r_n, r.r_env, r.r_status,
               r.r_msg, r.object_id
        FROM (SELECT DISTINCT job_id, job_file_id FROM c WHERE c.acts) c
        LEFT JOIN first_ack a ON a.job_id = c.job_id
        LEFT JOIN first_result r ON r.job_id = c.job_id
        WHERE a.a_n IS NOT NULL OR r.r_n IS NOT NULL
    ), objects AS (
        INSERT INTO arm.s3_object (id, bucket, key, bucket_role, created_by)
        SELECT ch.object_id, ch.r_env ->> 'result_bucket', ch.r_env ->> 'result_key',
               'results', ch.r_env ->> 'service_name'
        FROM changed ch
        WHERE ch.object_id IS NOT NULL
    ), jobs AS (
        UPDATE arm.recognition_job j
        SET status = coalesce(ch.r_status, 'processing'),
            started_at = CASE WHEN ch.a_n IS NOT NULL THEN v_now ELSE j.started_at END,
            service_name = coalesce(ch.r_env, ch.a_env) ->> 'service_name',
            service_version = coalesce(ch.r_env, ch.a_env) ->> 'service_version',
            finished_at = CASE WHEN ch.r_n IS NOT NULL THEN v_now END,
            metrics = CASE WHEN ch.r_n IS NOT NULL
                           THEN nullif(ch.r_env -> 'metrics', 'null'::jsonb) END,
            error_code = CASE WHEN ch.r_status = 'error' THEN ch.r_env ->> 'error_code' END,
            error_message = CASE WHEN ch.r_status = 'error'
                                 THEN ch.r_env ->> 'error_message' END,
            result_schema_version = ch.r_env ->> 'result_schema_version',
            result_s3_object_id = ch.object_id,
            result_msg_id = ch.r_msg
        FROM changed ch
        WHERE j.id = ch.job_id
        RETURNING j.id, j.pipeline, j.published_at, j.started_at, j.finished_at
    ), samples AS (
        -- What pacing adapts the in-flight limit from (22_pacing.sql): per pipeline, the
        -- answers and acks applied and how long after the publish they came.
        INSERT INTO arm.pace_sample (pipeline, answers, answer_seconds, acks, ack_seconds)
        SELECT u.pipeline,
               count(*) FILTER (WHERE ch.r_n IS NOT NULL),
               coalesce(sum(extract(epoch FROM u.finished_at - u.published_at))
                        FILTER (WHERE ch.r_n IS NOT NULL), 0),
               count(*) FILTER (WHERE ch.a_n IS NOT NULL),
               coalesce(sum(extract(epoch FROM u.started_at - u.published_at))
                        FILTER (WHERE ch.a_n IS NOT NULL), 0)
        FROM jobs u JOIN changed ch ON ch.job_id = u.id
        GROUP BY u.pipeline
    ), files AS (
        UPDATE arm.stored_file f
        SET status = CASE WHEN ch.r_status = 'error' THEN 'ERROR'
                          ELSE 'PROCESSING' END::arm.file_status
        FROM changed ch
        WHERE f.id = ch.job_file_id
          AND f.current_recognition_job_id = ch.job_id
          AND (ch.r_n IS NOT NULL OR f.status <> 'PROCESSING')
    )
    SELECT c.n,
           CASE
               WHEN NOT c.found THEN 'unknown_job'
               WHEN NOT c.held THEN 'busy'
               WHEN c.file_id IS DISTINCT FROM c.job_file_id THEN 'file_mismatch'
               WHEN c.s0 = 'queued' THEN 'not_published'
               WHEN c.is_ack THEN
                   CASE WHEN c.n = a.a_n THEN 'applied'
                        WHEN r.r_n < c.n OR arm.is_final(c.s0) THEN 'already_final'
                        ELSE 'duplicate' END
               WHEN arm.is_final(c.s0) THEN
                   CASE WHEN c.msg_id = c.m0 THEN 'duplicate' ELSE 'already_final' END
               WHEN c.n = r.r_n THEN 'applied'
               WHEN c.msg_id = r.r_msg THEN 'duplicate'
               ELSE 'already_final'
           END,
           CASE WHEN c.found AND c.held THEN c.job_attempt END,
           CASE
               WHEN NOT (c.found AND c.held) THEN NULL
               WHEN r.r_n <= c.n THEN r.r_status
               WHEN a.a_n <= c.n THEN 'processing'::arm.job_status
               ELSE c.s0
           END,
           -- The applied ack and the applied result are the first ones (above).
           CASE
               WHEN c.n = a.a_n THEN extract(epoch FROM u.started_at - u.published_at)
               WHEN c.n = r.r_n THEN extract(epoch FROM u.finished_at - u.started_at)
           END::float8
    FROM c
    LEFT JOIN first_ack a ON a.job_id = c.job_id
    LEFT JOIN first_result r ON r.job_id = c.job_id
    LEFT JOIN jobs u ON u.id = c.job_id
    ORDER BY c.n;
END;
$$;
