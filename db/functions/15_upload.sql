-- The upload as one call: arm.upload_files for many files, arm.upload_file for one.
-- Each writes what the plain-SQL upload of docs/dbas.md writes — an arm.s3_object of role
-- uploads, an arm.stored_file, its queued attempt 1, the file's current job — through the
-- same tables, so the same triggers (10_triggers.sql: the new job's and the source
-- object's checks, the wake-up NOTIFY) and constraints hold; they give the pipeline and
-- max_attempts the defaults trigger would fill, so it does not fire. The four-statement
-- plain-SQL upload stays supported beside them.
--
-- The input is a JSON array of objects, not parallel arrays: each file's fields are named
-- where they are given, so a missing or misspelt field is reported by name (an unknown
-- field is refused) instead of shifting every later file's values by one; and it is one
-- parameter whatever fields a later release adds, like apply_envelopes_v2's envelopes.
-- Fields: bucket, key, original_name, file_type (required, non-empty), consolidation_id
-- (a uuid), created_by, bucket_role (default uploads; the trigger refuses any other).
--
-- All or nothing: a bad file raises, naming the file (its 1-based position) and the field
-- (also in the error's COLUMN field), before anything is written. One statement, an
-- INSERT per table in one WITH, writes every file — the ids are drawn first, so a file
-- names its current job as it is inserted, and the foreign keys are checked at the
-- statement's end — so the wake-up trigger fires once for the batch: one NOTIFY at most.
-- Returns each file's position in the array, its id and its job's id.
CREATE OR REPLACE FUNCTION arm.upload_files(p_files jsonb)
RETURNS TABLE (n integer, file_id uuid, job_id uuid)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_bad record;
    v_max_attempts integer := arm.setting_int('default_max_attempts');
BEGIN
    IF p_files IS NULL OR jsonb_typeof(p_files) <> 'array' THEN
        RAISE EXCEPTION 'upload: files must be a JSON array of objects, not %',
            coalesce(jsonb_typeof(p_files), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'files';
    END IF;

    SELECT e.i, p.problem[1] AS field, p.problem[2] AS problem INTO v_bad
    FROM jsonb_array_elements(p_files) WITH ORDINALITY AS e(f, i)
    -- What an object has beside an upload's fields (a scalar takes no `-`).
    CROSS JOIN LATERAL (
        SELECT CASE WHEN jsonb_typeof(e.f) = 'object'
                    THEN e.f - ARRAY['bucket', 'key', 'original_name', 'file_type',
                                     'consolidation_id', 'created_by', 'bucket_role']
                    ELSE '{}' END AS unknown
    ) x
    CROSS JOIN LATERAL (
        SELECT CASE
            WHEN jsonb_typeof(e.f) <> 'object' THEN ARRAY['file', 'is not a JSON object']
            WHEN x.unknown <> '{}'
                THEN ARRAY[
                    (SELECT min(k) FROM jsonb_object_keys(x.unknown) k),
                    'is not a field of an upload (bucket, key, original_name, file_type, '
                    'consolidation_id, created_by, bucket_role)']
            ELSE coalesce(
                arm.upload_problem(e.f->>'bucket', e.f->>'key', e.f->>'original_name',
                                   e.f->>'file_type', e.f->>'bucket_role'),
                CASE WHEN e.f->>'consolidation_id' !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                     THEN ARRAY['consolidation_id',
                                format('%L is not a uuid', e.f->>'consolidation_id')] END)
        END AS problem
    ) p
    WHERE p.problem IS NOT NULL
    ORDER BY e.i
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'upload: file % of %: % %', v_bad.i, jsonb_array_length(p_files),
            v_bad.field, v_bad.problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = v_bad.field;
    END IF;

    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT e.i::integer AS i, arm.uuid_v7() AS obj_id, arm.uuid_v7() AS f_id,
               arm.uuid_v7() AS j_id, r.*
        FROM jsonb_array_elements(p_files) WITH ORDINALITY AS e(f, i)
        CROSS JOIN LATERAL jsonb_to_record(e.f) AS r(
            bucket text, key text, original_name text, file_type arm.file_type,
            consolidation_id uuid, created_by text, bucket_role arm.bucket_role)
    ), o AS (
        INSERT INTO arm.s3_object (id, bucket, key, bucket_role, created_by)
        SELECT obj_id, bucket, key, coalesce(bucket_role, 'uploads'), created_by
        FROM input ORDER BY i
        RETURNING id
    ), f AS (
        -- Each table's rows come from the previous one's RETURNING, so an object is in
        -- before its file and a file before its job: the source-role and defaults
        -- triggers read them (a trigger's query sees the statement's earlier rows).
        INSERT INTO arm.stored_file (id, consolidation_id, original_name, file_type,
                                     s3_object_id, current_recognition_job_id)
        SELECT input.f_id, input.consolidation_id, input.original_name, input.file_type,
               input.obj_id, input.j_id
        FROM input JOIN o ON o.id = input.obj_id ORDER BY input.i
        RETURNING id
    ), j AS (
        -- pipeline, max_attempts and lane given, as the defaults trigger would fill them: it
        -- then fires for none of the rows.
        INSERT INTO arm.recognition_job (id, file_id, attempt, pipeline, max_attempts, lane)
        SELECT input.j_id, input.f_id, 1, arm.pipeline_for(input.file_type), v_max_attempts,
               coalesce(input.consolidation_id, '00000000-0000-0000-0000-000000000000')
        FROM input JOIN f ON f.id = input.f_id ORDER BY input.i
        RETURNING id
    )
    SELECT input.i, input.f_id, input.j_id
    FROM input JOIN j ON j.id = input.j_id ORDER BY input.i;
END;
$$;

-- One file: the same rows and the same statement shape as arm.upload_files (one INSERT
-- per table in one WITH, the ids drawn first), the same checks (arm.upload_problem), but
-- from its parameters: no JSON to build and take apart, so the common case costs about
-- what one INSERT does. Returns the file's id and its job's id.
CREATE OR REPLACE FUNCTION arm.upload_file(
    p_bucket text,
    p_key text,
    p_original_name text,
    p_file_type text,
    p_consolidation_id uuid DEFAULT NULL,
    p_created_by text DEFAULT NULL,
    p_bucket_role text DEFAULT 'uploads'
)
RETURNS TABLE (file_id uuid, job_id uuid)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_problem text[];
    v_file uuid := arm.uuid_v7();
    v_job uuid := arm.uuid_v7();
BEGIN
    v_problem := arm.upload_problem(p_bucket, p_key, p_original_name, p_file_type,
                                    p_bucket_role);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'upload: % %', v_problem[1], v_problem[2]
            USING ERRCODE = 'invalid_parameter_value', COLUMN = v_problem[1];
    END IF;

    WITH o AS (
        INSERT INTO arm.s3_object (id, bucket, key, bucket_role, created_by)
        VALUES (arm.uuid_v7(), p_bucket, p_key,
                coalesce(p_bucket_role, 'uploads')::arm.bucket_role, p_created_by)
        RETURNING id
    ), f AS (
        INSERT INTO arm.stored_file (id, consolidation_id, original_name, file_type,
                                     s3_object_id, current_recognition_job_id)
        SELECT v_file, p_consolidation_id, p_original_name, p_file_type::arm.file_type,
               o.id, v_job
        FROM o
        RETURNING id
    )
    INSERT INTO arm.recognition_job (id, file_id, attempt, pipeline, max_attempts, lane)
    SELECT v_job, f.id, 1, arm.pipeline_for(p_file_type::arm.file_type),
           arm.setting_int('default_max_attempts'),
           coalesce(p_consolidation_id, '00000000-0000-0000-0000-000000000000')
    FROM f;
    RETURN QUERY SELECT v_file, v_job;
END;
$$;
