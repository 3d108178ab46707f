-- Who owns schema arm, and what each role of db/roles.sql may do in it (docs/dbas.md
-- "Database roles"). `arm-core migrate` runs this on every run, after db/functions and in the same
-- transaction: a function a function file has just created belongs to the migrating user
-- and is executable by PUBLIC — until this, before anyone else can see it. So everything
-- here is stated in full each time: ownership is moved to arm_owner where it is not
-- already, then every privilege of PUBLIC and of the runtime roles is revoked and granted
-- again as listed. Grants to other roles (a DBA's own) are left alone.
--
-- Adding a function: without a line here it is the owner's alone. A function a runtime
-- role calls gets a GRANT below, and is SECURITY DEFINER with
-- SET search_path = pg_catalog, arm, pg_temp (db/README.md); tests/integration/
-- test_roles.py holds the same table of who may call what, and fails until both agree.

-- 1. Owner. The migrations run as the migrating user, so what they create is that user's
-- until it moves here (on an upgraded database, everything moves once). ALTER … OWNER
-- locks a table briefly; it runs only where the owner is not arm_owner yet.
DO $owner$
DECLARE
    v_stmt text;
BEGIN
    IF (SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'arm')
       <> 'arm_owner'::regrole THEN
        ALTER SCHEMA arm OWNER TO arm_owner;
    END IF;
    FOR v_stmt IN
        -- Tables, views and free-standing sequences (an identity or serial sequence
        -- moves with its table; indexes too).
        SELECT format('ALTER %s %I.%I OWNER TO arm_owner',
                      CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                                     WHEN 'm' THEN 'MATERIALIZED VIEW'
                                     WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
                      n.nspname, c.relname)
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'arm'
          AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
          AND c.relowner <> 'arm_owner'::regrole
          AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                          WHERE d.classid = 'pg_catalog.pg_class'::regclass
                            AND d.objid = c.oid
                            AND d.refclassid = 'pg_catalog.pg_class'::regclass
                            AND d.deptype IN ('a', 'i'))
        UNION ALL
        -- Enums, domains and composite types (not a table's row type, not array types).
        SELECT format('ALTER TYPE %I.%I OWNER TO arm_owner', n.nspname, t.typname)
        FROM pg_catalog.pg_type t
        JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'arm'
          AND t.typowner <> 'arm_owner'::regrole
          AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_catalog.pg_class c
                                  WHERE c.oid = t.typrelid) = 'c')
          AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type e WHERE e.typarray = t.oid)
        UNION ALL
        SELECT format('ALTER ROUTINE %I.%I(%s) OWNER TO arm_owner', n.nspname, p.proname,
                      pg_catalog.pg_get_function_identity_arguments(p.oid))
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'arm' AND p.proowner <> 'arm_owner'::regrole
    LOOP
        EXECUTE v_stmt;
    END LOOP;
END;
$owner$;

-- A function the owner role creates by hand (SET ROLE arm_owner) is not PUBLIC's either.
ALTER DEFAULT PRIVILEGES FOR ROLE arm_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- 2. Start from nothing: PUBLIC and the runtime roles lose every privilege in arm.
REVOKE ALL ON SCHEMA arm FROM PUBLIC, arm_bridge, arm_api, arm_uploader, arm_readonly;
REVOKE ALL ON ALL TABLES IN SCHEMA arm
    FROM PUBLIC, arm_bridge, arm_api, arm_uploader, arm_readonly;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA arm
    FROM PUBLIC, arm_bridge, arm_api, arm_uploader, arm_readonly;
REVOKE ALL ON ALL ROUTINES IN SCHEMA arm
    FROM PUBLIC, arm_bridge, arm_api, arm_uploader, arm_readonly;

GRANT USAGE ON SCHEMA arm TO arm_bridge, arm_api, arm_uploader, arm_readonly;

-- 3. Read-only helpers, called per row inside the functions: executable by anyone, with
-- the caller's rights and no SET clause (db/functions/00_helpers.sql says why).
GRANT EXECUTE ON FUNCTION
    arm.is_final, arm.pipeline_for, arm.setting_int, arm._request_body, arm._request_text,
    arm.job_view,
    arm.fold_name, arm.name_pattern, arm.is_retryable, arm.nats_message_bytes,
    arm.envelope_problem, arm.upload_problem, arm.wait_bucket_bounds, arm.wait_quantile,
    arm.wait_summary,
    arm.uuid_v7 -- the tables' default id: the plain-SQL upload's inserts call it
TO PUBLIC;

-- 4. arm_bridge: exactly what the bridge calls (arm_core/queries.sql through its steps).
GRANT EXECUTE ON FUNCTION
    arm.publish_queued_jobs_v2, -- publisher step (and the queued wait of each job), PACING=off
    arm.publish_queued_jobs_v3, -- the same, paced (22_pacing.sql)
    arm.pace_unheard,          -- … and nobody listened to its probe
    arm.pace_view,             -- GET /metrics on the health port: each pipeline's pacing
    arm.outbox_ready_age,      -- the health check's outbox, and its gauge for the alert
    arm.claim_unacked_jobs,    -- ack-timeout step: republish …
    arm.mark_republished,
    arm.dead_letter_unacked,   -- … and dead-letter
    arm.dead_letter_unrepublishable, -- … or dead-letter what no longer fits max_payload
    arm.apply_envelopes_v2,    -- inbox step (and the ack and processing waits)
    arm.run_due_tasks,         -- scheduler tick
    arm.set_sweep_interval,    -- TIMEOUT_SWEEP_SECONDS at start; not the rest of the schedule
    arm.compact_counts,        -- scheduler tick: folds the per-status count deltas
    arm.status_view,           -- GET /metrics on the health port: arm_jobs{status}, the
                               -- outbox's age, the overdue jobs, the last sweep (alerts)
    arm.record_waits,          -- scheduler tick: the waits it observed, for the charts
    arm.record_bridge,         -- scheduler tick: this bridge is alive, and its state
    arm.forget_bridge          -- a clean stop: its row goes
TO arm_bridge;

-- 5. arm_api: retry, the file view and the file list (http/handlers.py).
GRANT EXECUTE ON FUNCTION arm.retry_file, arm.retry_files, arm.get_file TO arm_api;
GRANT EXECUTE ON FUNCTION arm.retry_file_v2, arm.retry_files_v2 TO arm_api;
GRANT EXECUTE ON FUNCTION arm.retry_file_v3, arm.retry_files_v3 TO arm_api;
GRANT EXECUTE ON FUNCTION arm.list_files TO arm_api;
-- GET /metrics (arm_jobs{status}) and GET /api/v1/status.
GRANT EXECUTE ON FUNCTION arm.job_counts, arm.status_view, arm.pace_view TO arm_api;
-- The health check: how long the oldest job pacing does not hold back has waited.
GRANT EXECUTE ON FUNCTION arm.outbox_ready_age TO arm_api;
-- GET /api/v1/status/series: the console's charts of the last hour.
GRANT EXECUTE ON FUNCTION arm.status_series TO arm_api;
-- GET /api/v1/status: the bridges that say they are alive (a serve that runs none).
GRANT EXECUTE ON FUNCTION arm.bridge_instances TO arm_api;

-- The health check of the previous release's bridge and API read the oldest queued job
-- themselves (this one calls arm.outbox_ready_age), so they keep working through an upgrade.
GRANT SELECT (status, requested_at) ON arm.recognition_job TO arm_bridge, arm_api;

-- 6. arm_uploader: the upload (docs/dbas.md) and nothing else. The one-call upload
-- (db/functions/15_upload.sql, the recommended one), and the plain-SQL upload: a file's
-- object, the file, its first job (the defaults trigger fills pipeline and max_attempts
-- as the owner), then the file's current job. The ids may be read back (RETURNING id, and
-- the WHERE of that UPDATE); status, timestamps and every later field are not theirs.
GRANT INSERT (id, bucket, key, bucket_role, created_by) ON arm.s3_object TO arm_uploader;
GRANT INSERT (id, consolidation_id, original_name, file_type, s3_object_id)
    ON arm.stored_file TO arm_uploader;
GRANT INSERT (id, file_id, pipeline, attempt, max_attempts)
    ON arm.recognition_job TO arm_uploader;
GRANT UPDATE (current_recognition_job_id) ON arm.stored_file TO arm_uploader;
GRANT SELECT (id) ON arm.s3_object, arm.stored_file, arm.recognition_job TO arm_uploader;
GRANT EXECUTE ON FUNCTION arm.upload_file, arm.upload_files TO arm_uploader;

-- 7. arm_readonly: every table, and the file view.
GRANT SELECT ON ALL TABLES IN SCHEMA arm TO arm_readonly;
GRANT EXECUTE ON FUNCTION arm.get_file, arm.job_counts, arm.file_counts, arm.status_view
    TO arm_readonly;
GRANT EXECUTE ON FUNCTION arm.list_files, arm.status_series, arm.bridge_instances
    TO arm_readonly;
GRANT EXECUTE ON FUNCTION arm.pace_view, arm.outbox_ready_age TO arm_readonly;

-- Everything else — set_setting, set_periodic_task, sweep_timeouts, sample_status,
-- pin_in_flight_limit, dead_letter_unpublishable,
-- schedule_with_pg_cron, unschedule_pg_cron, the triggers' functions — and every write to
-- a table directly, arm.periodic_task included, is the owner's: DBAs run them as a member
-- of arm_owner.
