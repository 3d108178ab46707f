-- Triggers: defaults for plain-SQL uploads, the state machine guard, and the NOTIFY
-- that wakes the publisher. They hold for every write path, functions and DBAs alike.

-- Fills what a plain-SQL upload may leave out (docs/behaviour.md#interfaces): the
-- pipeline follows the file's type, max_attempts comes from arm.setting
-- 'default_max_attempts', the lane is the file's consolidation. It fires only for a row that leaves one of them out (its WHEN
-- clause, checked without calling the function): the upload functions and a retry give
-- all three, so a bulk upload of 30,000 files calls no function per row. What every new job must be — queued, its pipeline its
-- file's — is checked once per statement for all of them (tg_recognition_job__inserted).
-- SECURITY DEFINER with a pinned search_path: it reads arm.stored_file and arm.setting,
-- which the uploader role (INSERT only, docs/dbas.md "Database roles") may not read (so
-- does the statement trigger below). The row triggers (the guard, the touch) read and
-- write no table and run with the rights of whoever writes, so a search_path of the
-- writer's choosing gains the writer nothing; they fire once per row (500 times in a
-- batch of apply_envelopes_v2), where a SET clause costs about 1 µs a call, and inside
-- the functions they run under the functions' pinned path anyway.
CREATE OR REPLACE FUNCTION arm.tg_recognition_job__defaults()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    IF NEW.pipeline IS NULL THEN
        -- An unknown file_id leaves it NULL: the foreign key reports it.
        SELECT arm.pipeline_for(f.file_type) INTO NEW.pipeline
        FROM arm.stored_file f WHERE f.id = NEW.file_id;
    END IF;
    IF NEW.max_attempts IS NULL THEN
        NEW.max_attempts := arm.setting_int('default_max_attempts');
    END IF;
    IF NEW.lane IS NULL THEN
        -- The pacing lane (db/functions/22_pacing.sql): the file's consolidation, the
        -- nil uuid for a file without one.
        SELECT coalesce(f.consolidation_id, '00000000-0000-0000-0000-000000000000')
        INTO NEW.lane
        FROM arm.stored_file f WHERE f.id = NEW.file_id;
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER tg_recognition_job__defaults
    BEFORE INSERT ON arm.recognition_job
    FOR EACH ROW WHEN (NEW.pipeline IS NULL OR NEW.max_attempts IS NULL OR NEW.lane IS NULL)
    EXECUTE FUNCTION arm.tg_recognition_job__defaults();

-- The state machine (docs/behaviour.md#state-machine), enforced for every write path:
--   queued → published → processing → done | needs_check | error
--   published | processing → timeout,
--   published → dlq (no ack after every republish, arm.dead_letter_unacked),
--   queued → dlq (the request cannot be published, arm.dead_letter_unpublishable),
--   published → done | needs_check | error (a result whose ack was lost).
-- A job's identity never changes; a final job changes only in group_schema (mapping).
-- Pinned like every function of arm: a trigger runs under the search_path of whoever
-- fired it, and a DBA's or an uploader's own schema first in it would otherwise decide
-- what `=` on arm.job_status means here. The caller's rights (no SECURITY DEFINER).
CREATE OR REPLACE FUNCTION arm.tg_recognition_job__guard()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    IF (NEW.id, NEW.file_id, NEW.attempt, NEW.pipeline, NEW.max_attempts, NEW.requested_at)
       IS DISTINCT FROM
       (OLD.id, OLD.file_id, OLD.attempt, OLD.pipeline, OLD.max_attempts, OLD.requested_at)
    THEN
        RAISE EXCEPTION 'recognition job %: id, file_id, attempt, pipeline, max_attempts '
                        'and requested_at never change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF arm.is_final(OLD.status) THEN
        IF (to_jsonb(NEW) - 'group_schema') IS DISTINCT FROM (to_jsonb(OLD) - 'group_schema') THEN
            RAISE EXCEPTION 'recognition job % is final (%): only group_schema may change',
                OLD.id, OLD.status
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
           (OLD.status = 'queued' AND NEW.status IN ('published', 'dlq'))
        OR (OLD.status = 'published' AND NEW.status IN
                ('processing', 'done', 'needs_check', 'error', 'timeout', 'dlq'))
        OR (OLD.status = 'processing' AND NEW.status IN
                ('done', 'needs_check', 'error', 'timeout'))
    ) THEN
        RAISE EXCEPTION 'recognition job %: no transition % → %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER tg_recognition_job__guard
    BEFORE UPDATE ON arm.recognition_job
    FOR EACH ROW EXECUTE FUNCTION arm.tg_recognition_job__guard();

-- Once per INSERT statement on arm.recognition_job, whoever inserts: every new job is
-- queued and its pipeline is its file's (a wrong one is refused, naming the file), then
-- the wake-up below. One query over the statement's rows (the transition table the count
-- trigger keeps anyway) instead of a function call per row: a bulk upload pays it once.
-- A job whose file does not exist was refused by the foreign key before this runs.
--
-- Wakes the publisher (LISTEN arm_recognition_job_queued) when queued jobs appear in an
-- empty queue: one notification per statement, and only when no other queued job is
-- there. PostgreSQL serializes the commits of notifying transactions on one global lock
-- held across the commit's WAL flush, so a NOTIFY in every upload would make concurrent
-- uploads (and retries) commit one at a time. A job that joins a non-empty queue needs
-- no wake-up: the publisher was woken for the first one, and after every cycle that
-- claimed jobs it polls at a short interval for a while (bridge/publisher.py), which
-- finds a job committed while it was publishing the others. OUTBOX_POLL_SECONDS is the
-- backstop of both (docs/behaviour.md#wake-up).
-- "Other": a queued job this statement did not insert (it may be the same transaction's,
-- from an earlier statement, which then had its own say). The probe reads at most one
-- more queued row than the statement inserted, through recognition_job_queued_idx.
-- SECURITY DEFINER, pinned: the uploader may insert jobs but not read them.
CREATE OR REPLACE FUNCTION arm.tg_recognition_job__inserted()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_bad record;
    v_mine bigint;
BEGIN
    SELECT i.status, i.pipeline, i.file_id, f.file_type,
           i.pipeline <> arm.pipeline_for(f.file_type) AS wrong_pipeline
    INTO v_bad
    FROM inserted i JOIN arm.stored_file f ON f.id = i.file_id
    WHERE i.pipeline <> arm.pipeline_for(f.file_type) OR i.status <> 'queued'
    LIMIT 1;
    IF FOUND AND v_bad.wrong_pipeline THEN
        RAISE EXCEPTION 'pipeline % does not match file type % of file %',
            v_bad.pipeline, v_bad.file_type, v_bad.file_id
            USING ERRCODE = 'check_violation';
    ELSIF FOUND THEN
        RAISE EXCEPTION 'a new recognition job starts queued, not %', v_bad.status
            USING ERRCODE = 'check_violation';
    END IF;

    SELECT count(*) INTO v_mine FROM inserted WHERE status = 'queued';
    IF v_mine > 0 AND (SELECT count(*) FROM (SELECT 1 FROM arm.recognition_job j
                                             WHERE j.status = 'queued'
                                             LIMIT v_mine + 1) q) <= v_mine THEN
        PERFORM pg_notify('arm_recognition_job_queued', '');
    END IF;
    RETURN NULL;
END;
$$;

-- It did the wake-up alone, under this name, before it also checked the new jobs.
DROP TRIGGER IF EXISTS tg_recognition_job__notify_queued ON arm.recognition_job;
DROP FUNCTION IF EXISTS arm.tg_recognition_job__notify_queued();

CREATE OR REPLACE TRIGGER tg_recognition_job__inserted
    AFTER INSERT ON arm.recognition_job
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_recognition_job__inserted();

-- Keeps stored_file.updated_at current on every update. Pinned (the plain-SQL upload's
-- UPDATE of current_recognition_job_id fires it under the uploader's search_path), the
-- caller's rights.
CREATE OR REPLACE FUNCTION arm.tg_stored_file__touch()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    IF NEW IS DISTINCT FROM OLD THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER tg_stored_file__touch
    BEFORE UPDATE ON arm.stored_file
    FOR EACH ROW EXECUTE FUNCTION arm.tg_stored_file__touch();

-- A file's source is an object of role `uploads` (the request's s3 is the uploaded
-- file); a `results` or `raw` object is refused, with the reason, for every write path
-- (the plain-SQL upload above all). Rows stored before this check are left as they are:
-- it checks new rows, once per INSERT statement over all of them (a bulk upload pays one
-- query, not a function call per file), and a change of s3_object_id, row by row.
-- SECURITY DEFINER with a pinned path, like the defaults trigger: the uploader may not
-- read bucket_role. It repeats the foreign key's own lookup of the object (by primary
-- key); an unknown object was refused by the foreign key before the statement's check.
CREATE OR REPLACE FUNCTION arm.tg_stored_file__source_role()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_bad record;
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN
        SELECT n.id, n.s3_object_id, o.bucket_role INTO v_bad
        FROM inserted n JOIN arm.s3_object o ON o.id = n.s3_object_id
        WHERE o.bucket_role <> 'uploads'
        LIMIT 1;
    ELSE
        SELECT NEW.id, NEW.s3_object_id, o.bucket_role INTO v_bad
        FROM arm.s3_object o
        WHERE o.id = NEW.s3_object_id AND o.bucket_role <> 'uploads';
    END IF;
    IF FOUND THEN
        RAISE EXCEPTION 'stored_file %: its source object % is a % object; a file''s source must be an uploads object',
            v_bad.id, v_bad.s3_object_id, v_bad.bucket_role
            USING ERRCODE = 'check_violation',
                  HINT = 'insert the uploaded file as arm.s3_object with bucket_role uploads';
    END IF;
    RETURN CASE WHEN TG_LEVEL = 'ROW' THEN NEW END;
END;
$$;

CREATE OR REPLACE TRIGGER tg_stored_file__source_role
    BEFORE UPDATE OF s3_object_id ON arm.stored_file
    FOR EACH ROW EXECUTE FUNCTION arm.tg_stored_file__source_role();

CREATE OR REPLACE TRIGGER tg_stored_file__source_role_insert
    AFTER INSERT ON arm.stored_file
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_stored_file__source_role();
