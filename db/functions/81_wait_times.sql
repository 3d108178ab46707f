-- The publisher's and the inbox's statements with the waits they ended (issue 11: the
-- histogram arm_job_wait_seconds{phase}). New names, not changed results: the previous
-- release's bridges keep calling publish_queued_jobs and apply_envelopes as they are
-- (db/README.md). Each is the original function plus one column, read from the rows the
-- original has just written.

-- publish_queued_jobs, and for each published job the seconds it waited queued
-- (requested_at → now, the moment of the claim within a few milliseconds). requested_at
-- never changes, so the join sees it whichever row version it reads.
CREATE OR REPLACE FUNCTION arm.publish_queued_jobs_v2(
    p_limit integer,
    p_tabular_reply_timeout interval,
    p_image_reply_timeout interval,
    p_tabular_subject text,
    p_image_subject text,
    p_max_bytes integer
)
RETURNS TABLE (
    job_id uuid,
    attempt integer,
    file_id uuid,
    outcome text,
    subject text,
    msg_id text,
    request text,
    error_message text,
    queued_seconds double precision
)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    SELECT p.job_id, p.attempt, p.file_id, p.outcome, p.subject, p.msg_id, p.request,
           p.error_message,
           CASE WHEN p.outcome = 'published'
                THEN extract(epoch FROM clock_timestamp() - j.requested_at)::float8 END
    FROM arm.publish_queued_jobs(p_limit, p_tabular_reply_timeout, p_image_reply_timeout,
                                 p_tabular_subject, p_image_subject, p_max_bytes)
         WITH ORDINALITY AS p
    JOIN arm.recognition_job j ON j.id = p.job_id
    ORDER BY p.ordinality;
$$;

-- apply_envelopes, and for each applied envelope the wait it ended: for an ack
-- (→ processing) published_at → started_at, for a result (→ done | needs_check | error)
-- started_at → finished_at (NULL when the job was never acked). The times are read in a
-- second statement, which sees what the first one wrote.
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
    v_ord integer[];
    v_outcome text[];
    v_attempt integer[];
    v_status arm.job_status[];
BEGIN
    SELECT array_agg(a.ord ORDER BY a.ord), array_agg(a.outcome ORDER BY a.ord),
           array_agg(a.attempt ORDER BY a.ord), array_agg(a.status ORDER BY a.ord)
    INTO v_ord, v_outcome, v_attempt, v_status
    FROM arm.apply_envelopes(p_envelopes) AS a;
    RETURN QUERY
    SELECT u.ord, u.outcome, u.attempt, u.status,
           CASE WHEN u.outcome <> 'applied' THEN NULL
                WHEN u.status = 'processing'
                    THEN extract(epoch FROM j.started_at - j.published_at)::float8
                ELSE extract(epoch FROM j.finished_at - j.started_at)::float8 END
    FROM unnest(v_ord, v_outcome, v_attempt, v_status) AS u(ord, outcome, attempt, status)
    LEFT JOIN arm.recognition_job j
        ON u.outcome = 'applied'
       AND j.id = (p_envelopes -> (u.ord - 1) ->> 'job_id')::uuid
    ORDER BY u.ord;
END;
$$;
