-- The timeout watchdog (R-TO-1). Scheduled as the periodic task 'sweep_timeouts'
-- (see 60_schedule.sql); safe to call directly and concurrently: rows another session
-- holds are skipped and picked up by the next sweep if still overdue.

-- Moves published/processing jobs whose reply_deadline has passed to timeout
-- (error_code TIMEOUT, finished_at now) and their files, where the job is current, to
-- ERROR. Times out every due job it can lock (rows another session holds are skipped)
-- and returns how many it timed out.
--
-- Its cost follows the due jobs, not the live ones or the history, whatever the column
-- statistics say. They cannot be trusted here: final jobs keep their reply_deadline, all
-- in the past, so the histogram of reply_deadline says most deadlines have passed, and a
-- single WITH due … UPDATE … FROM due was planned for thousands of due jobs where there
-- were a hundred (hash joins over sequential scans of recognition_job and stored_file).
-- So the sweep is written as steps whose plans do not depend on that estimate:
--   1. lock the due jobs in batches of 1000: ORDER BY reply_deadline LIMIT on the
--      partial index recognition_job_live_deadline_idx is an index range scan that stops
--      at the batch, however many rows the planner expects in the range ("now" is taken
--      once, before the scan: clock_timestamp() in the WHERE is volatile, evaluated per
--      row, and can only filter). The LIMIT is a literal so the planner always sees it;
--   2. update those jobs by primary key (id = ANY of the batch);
--   3. update their files by the batch's ids (id = ANY of its files, read through the
--      primary key or stored_file_current_job_idx). A file's current job is always its
--      own (stored_file_current_job_fkey references (id, file_id)), so "the file's
--      current job is one just timed out" is exactly the batch's files whose current job
--      is in the batch.
-- A batch that fills its LIMIT is followed by the next one, which starts at the last
-- deadline reached (>=: jobs sharing that deadline and not yet taken are included; those
-- already timed out no longer match and are passed over), so a large backlog drains in
-- one call and each batch re-reads at most the jobs of the deadline it starts at.
CREATE OR REPLACE FUNCTION arm.sweep_timeouts()
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_from timestamptz := '-infinity';
    v_due uuid[];
    v_jobs uuid[];
    v_files uuid[];
    v_count integer := 0;
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    LOOP
        SELECT array_agg(d.id), max(d.reply_deadline)
        INTO v_due, v_from
        FROM (
            SELECT j.id, j.reply_deadline
            FROM arm.recognition_job j
            WHERE j.status IN ('published', 'processing')
              AND j.reply_deadline < v_now
              AND j.reply_deadline >= v_from
            ORDER BY j.reply_deadline
            LIMIT 1000  -- the batch; keep in step with the EXIT below
            FOR UPDATE SKIP LOCKED
        ) d;
        EXIT WHEN v_due IS NULL;

        WITH moved AS (
            UPDATE arm.recognition_job j
            SET status = 'timeout',
                error_code = 'TIMEOUT',
                error_message = format('no result by reply_deadline %s', j.reply_deadline),
                finished_at = clock_timestamp()
            WHERE j.id = ANY (v_due)
              AND j.status IN ('published', 'processing')
            RETURNING j.id, j.file_id
        )
        SELECT array_agg(m.id), array_agg(m.file_id) INTO v_jobs, v_files FROM moved m;

        UPDATE arm.stored_file f
        SET status = 'ERROR'
        WHERE f.id = ANY (v_files)
          AND f.current_recognition_job_id = ANY (v_jobs);

        v_count := v_count + coalesce(cardinality(v_jobs), 0);
        EXIT WHEN cardinality(v_due) < 1000;
    END LOOP;
    RETURN v_count;
END;
$$;
