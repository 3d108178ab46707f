-- Triggers: defaults for plain-SQL uploads, the state machine guard, and the NOTIFY
-- that wakes the publisher. They hold for every write path, functions and DBAs alike.

-- Fills what a plain-SQL upload may leave out (SPEC §13): the pipeline follows the
-- file's type, max_attempts comes from arm.setting 'default_max_attempts'. A job always
-- starts queued, and its pipeline must match its file's type.
-- SECURITY DEFINER with a pinned search_path: it reads arm.stored_file and arm.setting,
-- which the uploader role (INSERT only, docs/dbas.md "Database roles") may not read (so
-- does the NOTIFY trigger below, once per statement). The row triggers (the guard, the
-- touch) read and write no table and run with the rights of whoever writes, so a
-- search_path of the writer's choosing gains the writer nothing; they fire once per row
-- (500 times in a batch of apply_envelopes_v2), where a SET clause costs about 1 µs a call,
-- and inside the functions they run under the functions' pinned path anyway.
CREATE OR REPLACE FUNCTION arm.tg_recognition_job__defaults()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_file_type arm.file_type;
BEGIN
    SELECT file_type INTO v_file_type FROM arm.stored_file WHERE id = NEW.file_id;
    IF FOUND THEN
        IF NEW.pipeline IS NULL THEN
            NEW.pipeline := arm.pipeline_for(v_file_type);
        ELSIF NEW.pipeline <> arm.pipeline_for(v_file_type) THEN
            RAISE EXCEPTION 'pipeline % does not match file type % of file %',
                NEW.pipeline, v_file_type, NEW.file_id
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;  -- an unknown file_id is left to the foreign key to report
    IF NEW.max_attempts IS NULL THEN
        NEW.max_attempts := arm.setting_int('default_max_attempts');
    END IF;
    IF NEW.status <> 'queued' THEN
        RAISE EXCEPTION 'a new recognition job starts queued, not %', NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER tg_recognition_job__defaults
    BEFORE INSERT ON arm.recognition_job
    FOR EACH ROW EXECUTE FUNCTION arm.tg_recognition_job__defaults();

-- The state machine (SPEC §4), enforced for every write path:
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
CREATE OR REPLACE FUNCTION arm.tg_recognition_job__notify_queued()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_mine bigint;
BEGIN
    SELECT count(*) INTO v_mine FROM inserted WHERE status = 'queued';
    IF v_mine > 0 AND (SELECT count(*) FROM (SELECT 1 FROM arm.recognition_job j
                                             WHERE j.status = 'queued'
                                             LIMIT v_mine + 1) q) <= v_mine THEN
        PERFORM pg_notify('arm_recognition_job_queued', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER tg_recognition_job__notify_queued
    AFTER INSERT ON arm.recognition_job
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_recognition_job__notify_queued();

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

-- A file's source is an object of role `uploads` (seed 003: the request's s3 is the
-- uploaded file); a `results` or `raw` object is refused, with the reason, for every
-- write path (the plain-SQL upload above all). Rows stored before this check are left
-- as they are: it fires on INSERT and on a change of s3_object_id only. SECURITY DEFINER
-- with a pinned path, like the defaults trigger: the uploader may not read bucket_role.
-- It repeats the foreign key's own lookup of the object (by primary key).
CREATE OR REPLACE FUNCTION arm.tg_stored_file__source_role()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_role arm.bucket_role;
BEGIN
    SELECT o.bucket_role INTO v_role FROM arm.s3_object o WHERE o.id = NEW.s3_object_id;
    IF FOUND AND v_role <> 'uploads' THEN
        RAISE EXCEPTION 'stored_file %: its source object % is a % object; a file''s source must be an uploads object',
            NEW.id, NEW.s3_object_id, v_role
            USING ERRCODE = 'check_violation',
                  HINT = 'insert the uploaded file as arm.s3_object with bucket_role uploads';
    END IF;  -- an unknown object is left to the foreign key to report
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER tg_stored_file__source_role
    BEFORE INSERT OR UPDATE OF s3_object_id ON arm.stored_file
    FOR EACH ROW EXECUTE FUNCTION arm.tg_stored_file__source_role();
