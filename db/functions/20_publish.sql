-- The outbox publisher's side after the first publish (R-ACK-2), which is
-- 21_publish_queued.sql: a request whose ack is overdue is published again, then
-- dead-lettered; one that cannot go out is dead-lettered at once. The bridge runs, in ONE
-- transaction: claim_unacked_jobs → publish every request to NATS again → confirm the
-- server has them → mark_republished → COMMIT. The claim's row locks keep other
-- publishers off the batch until the commit; if the publish fails the bridge rolls back
-- and the batch simply stays as it was.

-- Dead-letters published jobs that got no ack although they were republished
-- p_max_republish times and the last one is p_ack_timeout old: status dlq, error_code
-- NO_ACK, request_msg_id unchanged, and their files (where current) ERROR. Dead-letters
-- every such job it can lock (rows another session holds are skipped) and returns the
-- jobs it moved, for the caller's log.
-- Its cost follows the due jobs, not those waiting for an ack or the history, whatever
-- the column statistics say: final jobs keep last_published_at, all in the past, so the
-- planner expects most published jobs to be due, and a single WITH due … UPDATE … FROM
-- due was planned as hash joins over sequential scans of recognition_job and
-- stored_file. So, as arm.sweep_timeouts does, it goes in steps whose plans cannot
-- depend on that estimate:
--   1. lock a batch of due jobs in the order of recognition_job_unacked_idx,
--      (last_published_at, id): ORDER BY + a literal LIMIT make it an index range scan
--      that stops at the batch, whatever the planner expects in the range. "Due" is
--      computed once, before the scan (clock_timestamp() in the WHERE is evaluated per
--      row and could only filter);
--   2. update those jobs by primary key (id = ANY of the batch);
--   3. update their files by the batch's ids (id = ANY of its files, read through the
--      primary key or stored_file_current_job_idx). A file's current job is always its
--      own (stored_file_current_job_fkey references (id, file_id)), so the files whose
--      current job was just moved are exactly the batch's files whose current job is in
--      the batch.
-- A full batch is followed by the next, which starts after the last
-- (last_published_at, id) taken, so a large backlog drains in one call, each row once.
CREATE OR REPLACE FUNCTION arm.dead_letter_unacked(
    p_ack_timeout interval,
    p_max_republish integer
)
RETURNS TABLE (job_id uuid, attempt integer, file_id uuid, republish_count integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_due_before timestamptz := clock_timestamp() - p_ack_timeout;
    -- Each batch starts after (v_after_at, v_after_id), the last row of the one before.
    v_after_at timestamptz := '-infinity';
    v_after_id uuid := '00000000-0000-0000-0000-000000000000';
    v_due uuid[];
    v_jobs uuid[];
    v_attempts integer[];
    v_files uuid[];
    v_republished integer[];
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    LOOP
        SELECT array_agg(d.id ORDER BY d.last_published_at, d.id), max(d.last_published_at)
        INTO v_due, v_after_at
        FROM (
            SELECT j.id, j.last_published_at
            FROM arm.recognition_job j
            WHERE j.status = 'published'
              AND j.last_published_at <= v_due_before
              AND (j.last_published_at, j.id) > (v_after_at, v_after_id)
              AND j.republish_count >= p_max_republish
            ORDER BY j.last_published_at, j.id
            LIMIT 1000  -- the batch; keep in step with the EXIT below
            FOR UPDATE SKIP LOCKED
        ) d;
        EXIT WHEN v_due IS NULL;
        v_after_id := v_due[cardinality(v_due)];

        WITH moved AS (
            UPDATE arm.recognition_job j
            SET status = 'dlq',
                error_code = 'NO_ACK',
                error_message = format('no ack after %s publishes', j.republish_count + 1),
                finished_at = clock_timestamp()
            WHERE j.id = ANY (v_due) AND j.status = 'published'
            RETURNING j.id, j.attempt, j.file_id, j.republish_count
        )
        SELECT array_agg(m.id), array_agg(m.attempt), array_agg(m.file_id),
               array_agg(m.republish_count)
        INTO v_jobs, v_attempts, v_files, v_republished
        FROM moved m;

        UPDATE arm.stored_file f
        SET status = 'ERROR'
        WHERE f.id = ANY (v_files)
          AND f.current_recognition_job_id = ANY (v_jobs);

        RETURN QUERY SELECT * FROM unnest(v_jobs, v_attempts, v_files, v_republished);
        EXIT WHEN cardinality(v_due) < 1000;
    END LOOP;
END;
$$;

-- The one body of the two dead-letter steps of a request that cannot go out: moves the
-- named jobs that are still in p_from (queued: never published; published: cannot be
-- republished) to dlq with their codes and messages, finished_at now, and their files
-- to ERROR where the job is the current one. Parallel arrays of one length, every code
-- required; a job named twice takes its first code; rows locked in id order (no
-- deadlock between concurrent calls). The owner's alone: the two functions below call it.
CREATE OR REPLACE FUNCTION arm._dead_letter_jobs(
    p_from arm.job_status,
    p_job_ids uuid[],
    p_error_codes text[],
    p_error_messages text[]
)
RETURNS TABLE (job_id uuid, attempt integer, file_id uuid)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    IF cardinality(p_error_codes) IS DISTINCT FROM cardinality(p_job_ids)
       OR cardinality(p_error_messages) IS DISTINCT FROM cardinality(p_job_ids) THEN
        RAISE EXCEPTION 'dead-lettering takes one error code and one error message '
                        'per job id (% ids, % codes, % messages)',
            cardinality(p_job_ids), cardinality(p_error_codes), cardinality(p_error_messages)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_error_codes) AS c(code) WHERE coalesce(c.code, '') = '') THEN
        RAISE EXCEPTION 'dead-lettering needs an error code for every job'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    RETURN QUERY
    WITH wanted AS (
        SELECT DISTINCT ON (u.id) u.id, u.code, u.message
        FROM unnest(p_job_ids, p_error_codes, p_error_messages)
             WITH ORDINALITY AS u(id, code, message, n)
        WHERE u.id IS NOT NULL
        ORDER BY u.id, u.n
    ), locked AS (
        SELECT j.id, w.code, w.message
        FROM arm.recognition_job j
        JOIN wanted w ON w.id = j.id
        WHERE j.status = p_from
        ORDER BY j.id
        FOR UPDATE OF j
    ), moved AS (
        UPDATE arm.recognition_job j
        SET status = 'dlq',
            error_code = l.code,
            error_message = l.message,
            finished_at = clock_timestamp()
        FROM locked l
        WHERE j.id = l.id AND j.status = p_from
        RETURNING j.id, j.attempt, j.file_id
    ), files AS (
        UPDATE arm.stored_file f
        SET status = 'ERROR'
        FROM moved m
        WHERE f.id = m.file_id AND f.current_recognition_job_id = m.id
        RETURNING f.id
    )
    SELECT m.id, m.attempt, m.file_id FROM moved m;
END;
$$;

-- Dead-letters queued jobs that must not go out — a request the NATS server would
-- refuse, or one a DBA stops for another reason — so one bad request never holds the
-- outbox back. A DBA's call (docs/dbas.md): the publisher never calls it, it
-- dead-letters a request over max_payload in its own statement
-- (arm.publish_queued_jobs_v2, _v3: REQUEST_TOO_LARGE). Each job gets
-- status dlq, the given error_code and error_message and finished_at now; its publish
-- fields stay empty (the request never went out); its file becomes ERROR where the job
-- is the current one, so retry_file may make a new attempt as after any dlq.
-- p_job_ids, p_error_codes and p_error_messages are parallel arrays of one length; every
-- code is required, a message may be NULL; a job named twice takes its first code.
-- Only jobs still queued change: one that another transaction published meanwhile is
-- left alone (the lock waits for that commit and then sees it published). Rows are
-- locked in id order, so concurrent calls cannot deadlock. Returns the jobs it moved.
CREATE OR REPLACE FUNCTION arm.dead_letter_unpublishable(
    p_job_ids uuid[],
    p_error_codes text[],
    p_error_messages text[]
)
RETURNS TABLE (job_id uuid, attempt integer, file_id uuid)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    SELECT * FROM arm._dead_letter_jobs('queued', p_job_ids, p_error_codes, p_error_messages)
$$;

-- Dead-letters published jobs whose overdue request can no longer go out again — larger
-- than the server's max_payload now (it was lowered) — at once, so that every overdue
-- job ends (at most OUTBOX_MAX_REPUBLISH republishes, then dlq): status dlq
-- with the given code and message, finished_at now, the file ERROR where the job is the
-- current one. The publisher calls it in the transaction that claimed them for a
-- republish (arm.claim_unacked_jobs: they are locked, so still published). Only
-- published jobs change. Parallel arrays as dead_letter_unpublishable's. Returns the
-- jobs it moved.
CREATE OR REPLACE FUNCTION arm.dead_letter_unrepublishable(
    p_job_ids uuid[],
    p_error_codes text[],
    p_error_messages text[]
)
RETURNS TABLE (job_id uuid, attempt integer, file_id uuid)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    SELECT * FROM arm._dead_letter_jobs('published', p_job_ids, p_error_codes, p_error_messages)
$$;

-- Claims up to p_limit published jobs whose ack is overdue (last publish p_ack_timeout
-- ago) and that may still be republished, oldest first, skipping rows another publisher
-- holds. Returns the same request as the first publish (same reply_deadline, same
-- attempt), its subject and its Nats-Msg-Id, oldest first. Must run in the transaction
-- that calls mark_republished.
-- Its cost follows the claim, not the jobs awaiting an ack or the history, whatever the
-- column statistics say: final jobs keep last_published_at, all in the past, so the
-- planner expects most published jobs to be overdue. Planned on that estimate, a single
-- statement read every published job when p_limit was above it (a LIMIT that cannot stop
-- early no longer favours the ordered index), and joined a claim of p_limit estimated
-- rows to stored_file and s3_object by hashing both tables. So it goes in batches of at
-- most 1000, each in two steps:
--   1. lock the batch: "overdue" is computed once, before the scan, so
--      recognition_job_unacked_idx (last_published_at, id) is read from the oldest up to
--      that bound, in the claim's order; a LIMIT of at most 1000 stops that scan at the
--      batch whatever the planner expects in the range. The next batch starts after the
--      last (last_published_at, id) taken, so no row is read twice;
--   2. return the batch: its jobs by primary key (id = ANY of the batch, whose length the
--      planner knows), their files and objects by primary key.
CREATE OR REPLACE FUNCTION arm.claim_unacked_jobs(
    p_limit integer,
    p_ack_timeout interval,
    p_max_republish integer
)
RETURNS TABLE (
    job_id uuid,
    attempt integer,
    subject text,
    msg_id text,
    republish_count integer,
    request jsonb
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_due_before timestamptz := clock_timestamp() - p_ack_timeout;
    -- Each batch starts after (v_after_at, v_after_id), the last row of the one before.
    v_after_at timestamptz := '-infinity';
    v_after_id uuid := '00000000-0000-0000-0000-000000000000';
    v_claimed integer := 0;
    v_batch uuid[];
BEGIN
    LOOP
        SELECT array_agg(d.id ORDER BY d.last_published_at, d.id), max(d.last_published_at)
        INTO v_batch, v_after_at
        FROM (
            SELECT j.id, j.last_published_at
            FROM arm.recognition_job j
            WHERE j.status = 'published'
              AND j.last_published_at <= v_due_before
              AND (j.last_published_at, j.id) > (v_after_at, v_after_id)
              AND j.republish_count < p_max_republish
            ORDER BY j.last_published_at, j.id
            -- At most a batch (keep in step with the EXIT below); NULL p_limit: no limit.
            LIMIT least(p_limit - v_claimed, 1000)
            FOR UPDATE SKIP LOCKED
        ) d;
        EXIT WHEN v_batch IS NULL;
        v_after_id := v_batch[cardinality(v_batch)];
        v_claimed := v_claimed + cardinality(v_batch);

        RETURN QUERY
        SELECT j.id, j.attempt, j.request_subject, j.request_msg_id, j.republish_count,
               arm._request_body(j, f, o, j.reply_deadline)
        FROM arm.recognition_job j
        JOIN arm.stored_file f ON f.id = j.file_id
        JOIN arm.s3_object o ON o.id = f.s3_object_id
        WHERE j.id = ANY (v_batch)
        ORDER BY j.last_published_at, j.id;

        EXIT WHEN cardinality(v_batch) < 1000 OR v_claimed >= p_limit;
    END LOOP;
END;
$$;

-- Counts a republish of claimed jobs that reached NATS. Only published jobs change;
-- returns how many did.
CREATE OR REPLACE FUNCTION arm.mark_republished(p_job_ids uuid[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    UPDATE arm.recognition_job
    SET republish_count = republish_count + 1,
        last_published_at = clock_timestamp()
    WHERE id = ANY (p_job_ids)
      AND status = 'published';
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
