-- Per-status counts and the status view (arm_jobs{status}, GET /api/v1/status).
--
-- Counting: the tables arm.job_count / arm.file_count hold the counts as of the last
-- compaction; arm.job_count_delta / arm.file_count_delta hold net changes per status
-- since (migration 0004; heap only since 0009). No writer updates a shared row, so
-- writers never wait on each other for a counter. arm.compact_counts() folds the deltas
-- into the counts (the bridge's schedule runner calls it every few seconds; any number
-- may run at once: each DELETE … RETURNING takes a delta row once). Readers add the
-- deltas not folded yet, so a count is exact at the reader's snapshot, and reading costs
-- the number of delta rows since the last compaction, never the number of jobs or files
-- ever stored.
--
-- Every write is counted, whoever writes. INSERT, DELETE and TRUNCATE by statement-level
-- triggers with transition tables: one delta row per status a statement touched, whatever
-- the number of rows (a bulk upload of 30,000 files or a purge appends one). An UPDATE in
-- one of two ways, chosen per statement by the setting arm.counting:
--   * 'statement' — set by the functions that change many statuses per statement (the
--     publish, the inbox's batch, the sweep, the dead-letter steps), with set_config(…,
--     true) as they start, so to the end of their transaction (a SET clause on the
--     function would need a superuser's GRANT SET ON PARAMETER): the statement-level
--     trigger, as above;
--   * anything else (plain SQL: the upload's `SET current_recognition_job_id`, a DBA's
--     UPDATE; the one-row functions: a retry, a single ack or result, a republish) — a
--     row-level trigger whose WHEN clause lets only a changed status through, checked
--     without calling any function body: an UPDATE that changes no status costs nothing,
--     one that does appends -1 and +1 for each row.
-- The two WHEN clauses negate each other on the same setting, so exactly one trigger
-- counts each UPDATE. A session that sets arm.counting itself only chooses how its
-- updates are counted, never whether. The upload's UPDATE ran the statement-level
-- trigger for nothing: about 30 µs of its ~0.8 ms server time (docs/benchmarks.md).

-- The statement-level trigger function (eight triggers: recognition_job and stored_file;
-- INSERT, UPDATE, DELETE with transition tables, and TRUNCATE). Jobs queued in a new
-- pacing lane also add the lane (22_pacing.sql). SECURITY DEFINER: the
-- uploader's INSERT fires it and may not write the delta tables itself. It fires per
-- statement, where the SET costs once. This is its only definition: migration 0004
-- creates the tables it writes, the triggers come below.
CREATE OR REPLACE FUNCTION arm.tg_count_statuses()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    IF TG_TABLE_NAME = 'recognition_job' THEN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO arm.job_count_delta (status, n)
            SELECT r.status, count(*) FROM new_rows r GROUP BY r.status;
            -- A new lane of queued jobs (22_pacing.sql); one that exists is left as it is
            -- (no lock taken: uploads never wait on each other for it).
            INSERT INTO arm.pace_lane (pipeline, lane)
            SELECT DISTINCT r.pipeline, r.lane FROM new_rows r
            WHERE r.status = 'queued' AND r.lane IS NOT NULL
            ON CONFLICT DO NOTHING;
        ELSIF TG_OP = 'UPDATE' THEN
            INSERT INTO arm.job_count_delta (status, n)
            SELECT c.status, sum(c.n)
            FROM (SELECT r.status, 1 AS n FROM new_rows r
                  UNION ALL
                  SELECT r.status, -1 FROM old_rows r) c
            GROUP BY c.status
            HAVING sum(c.n) <> 0;
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO arm.job_count_delta (status, n)
            SELECT r.status, -count(*) FROM old_rows r GROUP BY r.status;
        ELSE  -- TRUNCATE
            DELETE FROM arm.job_count_delta;
            UPDATE arm.job_count SET n = 0 WHERE n <> 0;
            DELETE FROM arm.pace_lane;
        END IF;
    ELSE
        IF TG_OP = 'INSERT' THEN
            INSERT INTO arm.file_count_delta (status, n)
            SELECT r.status, count(*) FROM new_rows r GROUP BY r.status;
        ELSIF TG_OP = 'UPDATE' THEN
            INSERT INTO arm.file_count_delta (status, n)
            SELECT c.status, sum(c.n)
            FROM (SELECT r.status, 1 AS n FROM new_rows r
                  UNION ALL
                  SELECT r.status, -1 FROM old_rows r) c
            GROUP BY c.status
            HAVING sum(c.n) <> 0;
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO arm.file_count_delta (status, n)
            SELECT r.status, -count(*) FROM old_rows r GROUP BY r.status;
        ELSE
            DELETE FROM arm.file_count_delta;
            UPDATE arm.file_count SET n = 0 WHERE n <> 0;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- The row-level trigger function (two triggers: UPDATE on both tables), for updates that
-- are not counted by statement and change a row's status (the WHEN clause): -1 for the
-- old status, +1 for the new. SECURITY DEFINER as above.
CREATE OR REPLACE FUNCTION arm.tg_count_status_row()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    IF TG_TABLE_NAME = 'recognition_job' THEN
        INSERT INTO arm.job_count_delta (status, n) VALUES (OLD.status, -1), (NEW.status, 1);
    ELSE
        INSERT INTO arm.file_count_delta (status, n) VALUES (OLD.status, -1), (NEW.status, 1);
    END IF;
    RETURN NULL;
END;
$$;

-- The ten triggers: the eight statement-level ones (AFTER INSERT and DELETE with
-- transition tables, AFTER UPDATE with them when arm.counting is 'statement', AFTER
-- TRUNCATE) and the two row-level ones (AFTER UPDATE of a status, otherwise), on
-- arm.recognition_job and arm.stored_file. Created (or replaced) on every migrate, in
-- this file's transaction and under a lock that holds writers back (10_triggers.sql
-- takes the same one); the migrate that creates them — the first after migration 0004 —
-- also takes the counts in that transaction, so not a change falls between the counts
-- and the first counted statement, and the triggers never fire anything but the
-- functions above. A database whose eight statement-level triggers exist was counting
-- every write (the previous release's UPDATE triggers had no WHEN clause); its counts
-- carry on. Until then the tables are empty and nothing reads them: job_counts() and the
-- rest come with this file. A database before 0004 (a test applies today's functions to
-- a 0001 one) gets no triggers: writing tables that do not exist would break every
-- upload.
DO $count_triggers$
DECLARE
    v_counting boolean;
    v_table text;
BEGIN
    IF to_regclass('arm.job_count_delta') IS NULL THEN
        RETURN;
    END IF;
    LOCK TABLE arm.recognition_job, arm.stored_file IN SHARE ROW EXCLUSIVE MODE;
    v_counting := (SELECT count(*) = 8 FROM pg_catalog.pg_trigger t
                   WHERE t.tgfoid = 'arm.tg_count_statuses()'::regprocedure);

    FOREACH v_table IN ARRAY ARRAY['recognition_job', 'stored_file'] LOOP
        EXECUTE format($t$
            CREATE OR REPLACE TRIGGER tg_%1$s__count_insert
                AFTER INSERT ON arm.%1$I REFERENCING NEW TABLE AS new_rows
                FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
            CREATE OR REPLACE TRIGGER tg_%1$s__count_update
                AFTER UPDATE ON arm.%1$I
                REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
                FOR EACH STATEMENT
                WHEN (pg_catalog.current_setting('arm.counting', true) = 'statement')
                EXECUTE FUNCTION arm.tg_count_statuses();
            CREATE OR REPLACE TRIGGER tg_%1$s__count_delete
                AFTER DELETE ON arm.%1$I REFERENCING OLD TABLE AS old_rows
                FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
            CREATE OR REPLACE TRIGGER tg_%1$s__count_truncate
                AFTER TRUNCATE ON arm.%1$I
                FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();
            CREATE OR REPLACE TRIGGER tg_%1$s__count_update_row
                AFTER UPDATE ON arm.%1$I
                FOR EACH ROW
                WHEN (OLD.status IS DISTINCT FROM NEW.status
                      AND pg_catalog.current_setting('arm.counting', true)
                          IS DISTINCT FROM 'statement')
                EXECUTE FUNCTION arm.tg_count_status_row();
        $t$, v_table);
    END LOOP;

    IF NOT v_counting THEN
        -- The triggers were not (all) there: the counts start again from the rows.
        DELETE FROM arm.job_count_delta;
        DELETE FROM arm.job_count;
        INSERT INTO arm.job_count (status, n)
        SELECT s, (SELECT count(*) FROM arm.recognition_job j WHERE j.status = s)
        FROM unnest(enum_range(NULL::arm.job_status)) AS s;
        DELETE FROM arm.file_count_delta;
        DELETE FROM arm.file_count;
        INSERT INTO arm.file_count (status, n)
        SELECT s, (SELECT count(*) FROM arm.stored_file f WHERE f.status = s)
        FROM unnest(enum_range(NULL::arm.file_status)) AS s;
    END IF;
END;
$count_triggers$;

-- Folds every delta row into the counts; returns how many delta rows it folded. Also
-- drops the pacing samples nobody took (22_pacing.sql).
CREATE OR REPLACE FUNCTION arm.compact_counts()
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_jobs integer;
    v_files integer;
BEGIN
    WITH d AS (
        DELETE FROM arm.job_count_delta RETURNING status, n
    ), s AS (
        SELECT d.status, sum(d.n) AS n, count(*) AS k FROM d GROUP BY d.status
    ), up AS (
        INSERT INTO arm.job_count AS c (status, n)
        SELECT s.status, s.n FROM s
        ON CONFLICT (status) DO UPDATE SET n = c.n + EXCLUDED.n
    )
    SELECT coalesce(sum(s.k), 0) INTO v_jobs FROM s;
    WITH d AS (
        DELETE FROM arm.file_count_delta RETURNING status, n
    ), s AS (
        SELECT d.status, sum(d.n) AS n, count(*) AS k FROM d GROUP BY d.status
    ), up AS (
        INSERT INTO arm.file_count AS c (status, n)
        SELECT s.status, s.n FROM s
        ON CONFLICT (status) DO UPDATE SET n = c.n + EXCLUDED.n
    )
    SELECT coalesce(sum(s.k), 0) INTO v_files FROM s;
    -- The inbox's pacing samples that no paced claim took (PACING=off, or a pipeline
    -- nobody publishes to now): a minute is more than any adjustment window.
    DELETE FROM arm.pace_sample WHERE at < clock_timestamp() - interval '1 minute';
    RETURN v_jobs + v_files;
END;
$$;

-- Jobs per status, every status of arm.job_status (0 included): the compacted count plus
-- the deltas not compacted yet.
CREATE OR REPLACE FUNCTION arm.job_counts()
RETURNS TABLE (status text, n bigint)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    -- plpgsql, not sql: its tables come with migration 0004, and this file may be applied
    -- before it (a SQL function's body is checked when it is created).
    RETURN QUERY
    SELECT s::text,
           coalesce((SELECT c.n FROM arm.job_count c WHERE c.status = s), 0)
           + coalesce((SELECT sum(d.n) FROM arm.job_count_delta d WHERE d.status = s), 0)::bigint
    FROM unnest(enum_range(NULL::arm.job_status)) AS s
    ORDER BY s;
END;
$$;

-- Files per status, the same way.
CREATE OR REPLACE FUNCTION arm.file_counts()
RETURNS TABLE (status text, n bigint)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT s::text,
           coalesce((SELECT c.n FROM arm.file_count c WHERE c.status = s), 0)
           + coalesce((SELECT sum(d.n) FROM arm.file_count_delta d WHERE d.status = s), 0)::bigint
    FROM unnest(enum_range(NULL::arm.file_status)) AS s
    ORDER BY s;
END;
$$;

-- GET /api/v1/status in one call. Each figure reads only live rows, through the partial
-- indexes of migration 0001/0002 (their predicates name only live statuses), or the
-- counts above — nothing here grows with final jobs or with files:
--   jobs, files                 job_counts(), file_counts() as JSON objects (a file whose
--                               job is done or needs_check stays PROCESSING: it waits
--                               for the mapping step, another service's)
--   oldest_queued_age_seconds   recognition_job_queued_idx (0 when nothing is queued)
--   unacked_overdue             published, last published more than p_ack_timeout ago
--                               (recognition_job_unacked_idx): what the ack-timeout step
--                               republishes or dead-letters next
--   past_deadline_unswept       published or processing past reply_deadline
--                               (recognition_job_live_deadline_idx): what the next sweep
--                               times out
--   last_sweep_*                arm.periodic_task's row of sweep_timeouts (NULL before
--                               its first run)
CREATE OR REPLACE FUNCTION arm.status_view(p_ack_timeout interval)
RETURNS TABLE (
    jobs jsonb,
    files jsonb,
    oldest_queued_age_seconds double precision,
    unacked_overdue bigint,
    past_deadline_unswept bigint,
    last_sweep_at timestamptz,
    last_sweep_result text,
    last_sweep_error text
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    SELECT
        (SELECT jsonb_object_agg(c.status, c.n) FROM arm.job_counts() c),
        (SELECT jsonb_object_agg(c.status, c.n) FROM arm.file_counts() c),
        (SELECT coalesce(extract(epoch FROM clock_timestamp() - min(j.requested_at)), 0)::float8
         FROM arm.recognition_job j WHERE j.status = 'queued'),
        (SELECT count(*) FROM arm.recognition_job j
         WHERE j.status = 'published'
           AND j.last_published_at < clock_timestamp() - p_ack_timeout),
        (SELECT count(*) FROM arm.recognition_job j
         WHERE j.status IN ('published', 'processing')
           AND j.reply_deadline < clock_timestamp()),
        t.last_finished_at, t.last_result, t.last_error
    FROM (SELECT 1) AS one
    LEFT JOIN arm.periodic_task t ON t.name = 'sweep_timeouts';
$$;
