-- Periodic tasks (R-TO-1 scheduling). arm.periodic_task is the schedule a DBA reads and
-- changes with SQL — reading it takes arm_readonly, changing it the owner role, because
-- every bridge runs the function a row names (as the owner, in arm.run_due_tasks):
--   SELECT name, run_every, enabled, next_run_at, last_finished_at, last_result, last_error
--   FROM arm.periodic_task;
--   SET ROLE arm_owner;
--   UPDATE arm.periodic_task SET run_every = interval '10 seconds' WHERE name = 'sweep_timeouts';
-- arm.run_due_tasks() runs whatever is due. The bridge calls it about every second;
-- where pg_cron is installed it may call it too (arm.schedule_with_pg_cron(); off:
-- arm.unschedule_pg_cron()). The one change the bridge makes is the sweep's period,
-- through arm.set_sweep_interval.

-- Runs every enabled task whose next_run_at has come, each in a subtransaction: a
-- failing task records last_error and the others still run. A task row stays locked
-- while it runs and other callers skip it (SKIP LOCKED), so any number of bridges and
-- pg_cron may call this at once and each task still runs once per period.
-- Returns one row per task it ran.
CREATE OR REPLACE FUNCTION arm.run_due_tasks()
RETURNS TABLE (task text, result text, error text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    t arm.periodic_task;
    v_started timestamptz;
    v_result text;
    v_error text;
BEGIN
    FOR t IN
        SELECT * FROM arm.periodic_task p
        WHERE p.enabled AND p.next_run_at <= clock_timestamp()
        ORDER BY p.next_run_at
        FOR UPDATE SKIP LOCKED
    LOOP
        v_started := clock_timestamp();
        v_result := NULL;
        v_error := NULL;
        BEGIN
            EXECUTE format('SELECT (%s)::text', t.function_name::text) INTO v_result;
        EXCEPTION WHEN OTHERS THEN
            v_error := SQLSTATE || ': ' || SQLERRM;
        END;
        UPDATE arm.periodic_task p
        SET last_started_at = v_started,
            last_finished_at = clock_timestamp(),
            last_result = v_result,
            last_error = v_error,
            run_count = p.run_count + 1,
            next_run_at = v_started + p.run_every
        WHERE p.name = t.name;
        task := t.name;
        result := v_result;
        error := v_error;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Adds or changes a periodic task. p_function must be a function of no arguments, e.g.
-- 'arm.sweep_timeouts()'. The next run is due one period from now at the latest.
CREATE OR REPLACE FUNCTION arm.set_periodic_task(
    p_name text,
    p_function regprocedure,
    p_run_every interval,
    p_enabled boolean DEFAULT true
)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    IF (SELECT pronargs FROM pg_proc WHERE oid = p_function) <> 0 THEN
        RAISE EXCEPTION 'periodic task %: % must take no arguments', p_name, p_function
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO arm.periodic_task (name, function_name, run_every, enabled)
    VALUES (p_name, p_function, p_run_every, p_enabled)
    ON CONFLICT (name) DO UPDATE
    SET function_name = EXCLUDED.function_name,
        run_every = EXCLUDED.run_every,
        enabled = EXCLUDED.enabled,
        next_run_at = least(arm.periodic_task.next_run_at, clock_timestamp() + EXCLUDED.run_every);
END;
$$;

-- Sets the period of the timeout sweep from TIMEOUT_SWEEP_SECONDS (`arm-core migrate`, and
-- every bridge at start). The one function of the schedule granted to arm_bridge: it
-- changes sweep_timeouts' run_every and nothing else — never which function the task
-- runs, nor whether it is enabled — and the next run comes one period from now at the
-- latest. A missing row is created as 60_schedule.sql ships it.
CREATE OR REPLACE FUNCTION arm.set_sweep_interval(p_run_every interval)
RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    INSERT INTO arm.periodic_task (name, function_name, run_every)
    VALUES ('sweep_timeouts', 'arm.sweep_timeouts()', p_run_every)
    ON CONFLICT (name) DO UPDATE
    SET run_every = EXCLUDED.run_every,
        next_run_at = least(arm.periodic_task.next_run_at, clock_timestamp() + EXCLUDED.run_every)
$$;

-- Asks pg_cron, where installed, to call arm.run_due_tasks() — every 10 seconds where the
-- installed pg_cron takes second schedules (1.5 and later), every minute otherwise
-- (Debian's postgresql-15-cron is 1.4) — as the cron job 'arm-run-due-tasks' of the
-- caller in this database. The bridge's one-second tick stays the primary scheduler;
-- this keeps the schedule (the sweep above all) running when no bridge is. Idempotent:
-- pg_cron keeps one job per name and user, so calling it again changes that job (and
-- moves it to seconds after an upgrade of pg_cron) instead of adding one. The job runs as
-- the caller, who must be able to run arm.run_due_tasks() (a member of arm_owner). With
-- the caller's rights, because cron.schedule needs them. Returns the cron job id; raises
-- when pg_cron is not installed in this database. The way off: arm.unschedule_pg_cron().
CREATE OR REPLACE FUNCTION arm.schedule_with_pg_cron()
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_job bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database; the bridge runs the schedule'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    -- The library decides, not pg_extension.extversion: the library loaded may be newer
    -- than the extension's SQL (an upgraded package before ALTER EXTENSION … UPDATE).
    BEGIN
        EXECUTE $cron$SELECT cron.schedule('arm-run-due-tasks', '10 seconds',
                                            'SELECT * FROM arm.run_due_tasks()')$cron$
            INTO v_job;
        RAISE NOTICE 'pg_cron job % (arm-run-due-tasks) calls arm.run_due_tasks() every 10 seconds',
            v_job;
    EXCEPTION WHEN invalid_parameter_value THEN
        -- pg_cron before 1.5: "invalid schedule: 10 seconds".
        EXECUTE $cron$SELECT cron.schedule('arm-run-due-tasks', '* * * * *',
                                            'SELECT * FROM arm.run_due_tasks()')$cron$
            INTO v_job;
        RAISE NOTICE 'pg_cron job % (arm-run-due-tasks) calls arm.run_due_tasks() every minute '
                     '(this pg_cron takes no second schedules; 1.5 and later do)', v_job;
    END;
    RETURN v_job;
END;
$$;

-- The way off: removes the pg_cron jobs 'arm-run-due-tasks' of this database that the
-- caller may remove — its own; a superuser's call removes everyone's (pg_cron lets each
-- user see and remove only their own jobs). Returns how many it removed: 0 when there
-- was none, or pg_cron is not installed. The bridges' schedule is untouched.
CREATE OR REPLACE FUNCTION arm.unschedule_pg_cron()
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_job bigint;
    v_removed integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        RETURN 0;
    END IF;
    FOR v_job IN
        EXECUTE $cron$SELECT jobid FROM cron.job
                     WHERE jobname = 'arm-run-due-tasks' AND database = current_database()
                     ORDER BY jobid$cron$
    LOOP
        EXECUTE 'SELECT cron.unschedule($1)' USING v_job;
        v_removed := v_removed + 1;
    END LOOP;
    RETURN v_removed;
END;
$$;

-- The tasks this project ships. A DBA's later changes to run_every or enabled are kept.
INSERT INTO arm.periodic_task (name, function_name, run_every)
VALUES ('sweep_timeouts', 'arm.sweep_timeouts()', interval '30 seconds')
ON CONFLICT (name) DO NOTHING;
