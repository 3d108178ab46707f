-- The timeout watchdog (R-TO-1). Scheduled as the periodic task 'sweep_timeouts'
-- (see 60_schedule.sql); safe to call directly and concurrently: rows another session
-- holds are skipped and picked up by the next sweep if still overdue.

-- Moves published/processing jobs whose reply_deadline has passed to timeout
-- (error_code TIMEOUT, finished_at now) and their files, where the job is current, to
-- ERROR. Returns how many jobs it timed out. "Now" is taken once, before the scan, so
-- reply_deadline < now is a range of recognition_job_live_deadline_idx and the sweep
-- reads only the overdue jobs, not every live one (clock_timestamp() in the WHERE is
-- volatile: evaluated per row, it can only filter).
CREATE OR REPLACE FUNCTION arm.sweep_timeouts()
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer;
BEGIN
    WITH due AS (
        SELECT j.id
        FROM arm.recognition_job j
        WHERE j.status IN ('published', 'processing')
          AND j.reply_deadline < v_now
        FOR UPDATE SKIP LOCKED
    ), moved AS (
        UPDATE arm.recognition_job j
        SET status = 'timeout',
            error_code = 'TIMEOUT',
            error_message = format('no result by reply_deadline %s', j.reply_deadline),
            finished_at = clock_timestamp()
        FROM due
        WHERE j.id = due.id
          AND j.status IN ('published', 'processing')
        RETURNING j.id, j.file_id
    ), files AS (
        UPDATE arm.stored_file f
        SET status = 'ERROR'
        FROM moved m
        WHERE f.id = m.file_id AND f.current_recognition_job_id = m.id
        RETURNING f.id
    )
    SELECT count(*)::integer INTO v_count FROM moved;
    RETURN v_count;
END;
$$;
