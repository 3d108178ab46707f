-- The publisher's hot path (R-OUT-1) in one call per batch. The bridge runs, in ONE
-- transaction:
--   publish_queued_jobs_v2 → publish every `published` row's request to NATS → confirm
--   the server has them → COMMIT   (or ROLLBACK when the batch could not be confirmed).
-- The rows are marked in the same call that claims them, so each job costs one round
-- trip and one row version. Nothing changes in what others can see:
-- until the commit the jobs are queued for everyone else, and the commit comes only
-- after the server confirmed every message, so a job is still never marked published
-- unless its message reached NATS. published_at is the moment of the claim, a few
-- milliseconds before the publish.

-- Builds, sizes and marks the claimed jobs p_ids (locked by the caller, in this
-- transaction): published, or dlq when the request does not fit p_max_bytes; returns
-- them as arm.publish_queued_jobs_v2 does, oldest first. The body both claims share
-- (v2 oldest first, v3 paced: 22_pacing.sql); the owner's alone.
CREATE OR REPLACE FUNCTION arm._publish_claimed(
    p_ids uuid[],
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
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_ids uuid[] := p_ids;
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    RETURN QUERY
    WITH built AS (
        SELECT j.id, j.file_id, j.attempt, j.requested_at,
               j.id::text || ':' || j.attempt AS msg_id,
               CASE j.pipeline WHEN 'tabular' THEN p_tabular_subject
                               ELSE p_image_subject END AS subject,
               d.deadline,
               arm._request_text(j.id, f.id, j.pipeline, f.file_type, f.original_name,
                                 o.bucket, o.key, d.deadline, j.attempt) AS request
        FROM arm.recognition_job j
        JOIN arm.stored_file f ON f.id = j.file_id
        JOIN arm.s3_object o ON o.id = f.s3_object_id
        CROSS JOIN LATERAL (
            SELECT date_trunc('milliseconds', v_now
                + CASE j.pipeline WHEN 'tabular' THEN p_tabular_reply_timeout
                                  ELSE p_image_reply_timeout END) AS deadline
        ) d
        WHERE j.id = ANY (v_ids)
    ), sized AS (
        -- What the server counts against max_payload (00_helpers.sql).
        SELECT b.*, arm.nats_message_bytes(b.request, b.msg_id) AS bytes
        FROM built b
    ), marked AS (
        UPDATE arm.recognition_job j
        SET status = CASE WHEN s.bytes <= p_max_bytes THEN 'published'
                          ELSE 'dlq' END::arm.job_status,
            published_at = CASE WHEN s.bytes <= p_max_bytes THEN v_now END,
            last_published_at = CASE WHEN s.bytes <= p_max_bytes THEN v_now END,
            request_msg_id = CASE WHEN s.bytes <= p_max_bytes THEN s.msg_id END,
            request_subject = CASE WHEN s.bytes <= p_max_bytes THEN s.subject END,
            reply_deadline = CASE WHEN s.bytes <= p_max_bytes THEN s.deadline END,
            error_code = CASE WHEN s.bytes > p_max_bytes THEN 'REQUEST_TOO_LARGE' END,
            error_message = CASE WHEN s.bytes > p_max_bytes THEN format(
                'the request is %s bytes; the NATS server accepts at most %s (max_payload)',
                s.bytes, p_max_bytes) END,
            finished_at = CASE WHEN s.bytes > p_max_bytes THEN v_now END
        FROM sized s
        WHERE j.id = s.id AND j.id = ANY (v_ids)
        RETURNING j.id, j.status, j.error_message, j.published_at
    ), files AS (
        UPDATE arm.stored_file f
        SET status = 'ERROR'
        FROM marked m JOIN sized s ON s.id = m.id
        WHERE m.status = 'dlq' AND f.id = s.file_id AND f.current_recognition_job_id = m.id
    )
    SELECT s.id, s.attempt, s.file_id, m.status::text,
           s.subject, s.msg_id,
           CASE WHEN m.status = 'published' THEN s.request END,
           m.error_message,
           extract(epoch FROM m.published_at - s.requested_at)::float8
    FROM sized s
    JOIN marked m ON m.id = s.id
    ORDER BY s.requested_at, s.id;
END;
$$;

-- Claims up to p_limit queued jobs, oldest first, skipping rows another publisher holds,
-- and in the same statement:
--   * a job whose request fits p_max_bytes (the server's max_payload; the request plus
--     its Nats-Msg-Id header block) is marked published, with its subject, Nats-Msg-Id
--     `<job_id>:<attempt>`, and a reply_deadline from the pipeline's reply timeout;
--   * a job whose request does not fit is moved queued → dlq with error_code
--     REQUEST_TOO_LARGE (nothing was sent), and its file, where current, to ERROR: it can
--     never be published, and it must not hold back the jobs behind it.
-- Returns one row per job: outcome (`published` | `dlq`), the subject, the Nats-Msg-Id
-- and the request as JSON text (to be sent as it is) for published ones, the error for
-- dlq ones, and queued_seconds: how long a published job waited queued (requested_at →
-- published_at, the claim; NULL for a dead-lettered one), for the histogram
-- arm_job_wait_seconds{phase="queued"}. Must run inside the transaction that publishes
-- and then commits.
--
-- _v2: the first version had no queued_seconds (a new result column is a new name,
-- db/README.md). No release called it; migration 0007 drops it.

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
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    -- Two steps, like claim_unacked_jobs: 1. lock the batch, oldest first, through
    -- recognition_job_queued_idx; 2. build, size and mark it by primary key (id = ANY of
    -- the batch). In one statement the planner could not know the batch was small and,
    -- at some table sizes, hashed all of recognition_job and stored_file (final jobs
    -- included) to join a few hundred rows; and the one statement was planned again on
    -- every call (its generic plan was that hash), about 2 ms a batch. These two plan
    -- once and read only the batch.
    SELECT array_agg(q.id ORDER BY q.requested_at, q.id)
    INTO v_ids
    FROM (
        SELECT j.id, j.requested_at
        FROM arm.recognition_job j
        WHERE j.status = 'queued'
        ORDER BY j.requested_at, j.id
        LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED
    ) q;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY SELECT * FROM arm._publish_claimed(
        v_ids, p_tabular_reply_timeout, p_image_reply_timeout, p_tabular_subject,
        p_image_subject, p_max_bytes);
END;
$$;
