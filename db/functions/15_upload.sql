-- The upload as one call: arm.upload_files for many files, arm.upload_file for one.
-- Each writes what the plain-SQL upload of docs/dbas.md writes — an arm.s3_object of role
-- uploads, an arm.stored_file, its queued attempt 1, the file's current job — through the
-- same tables, so the same triggers (10_triggers.sql: the defaults, the source-must-be-
-- an-uploads-object check, the wake-up NOTIFY) and constraints hold. The four-statement
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
BEGIN
    IF p_files IS NULL OR jsonb_typeof(p_files) <> 'array' THEN
        RAISE EXCEPTION 'upload: files must be a JSON array of objects, not %',
            coalesce(jsonb_typeof(p_files), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'files';
    END IF;

    SELECT e.i, p.field, p.problem INTO v_bad
    FROM jsonb_array_elements(p_files) WITH ORDINALITY AS e(f, i)
    CROSS JOIN LATERAL (
        SELECT * FROM (VALUES
            (1, 'file',
             CASE WHEN jsonb_typeof(e.f) <> 'object' THEN 'is not a JSON object' END),
            (2, (SELECT k FROM jsonb_object_keys(
                     CASE WHEN jsonb_typeof(e.f) = 'object' THEN e.f ELSE '{}' END) k
                 WHERE k NOT IN ('bucket', 'key', 'original_name', 'file_type',
                                 'consolidation_id', 'created_by', 'bucket_role')
                 ORDER BY k LIMIT 1),
             'is not a field of an upload (bucket, key, original_name, file_type, '
             'consolidation_id, created_by, bucket_role)'),
            (3, 'bucket', CASE WHEN coalesce(e.f->>'bucket', '') = '' THEN 'must not be empty' END),
            (4, 'key', CASE WHEN coalesce(e.f->>'key', '') = '' THEN 'must not be empty' END),
            (5, 'original_name',
             CASE WHEN coalesce(e.f->>'original_name', '') = '' THEN 'must not be empty' END),
            (6, 'file_type',
             CASE WHEN e.f->>'file_type' IS NULL THEN 'must be given'
                  WHEN NOT (e.f->>'file_type' = ANY (enum_range(NULL::arm.file_type)::text[]))
                  THEN format('%L is not a file type (%s)', e.f->>'file_type',
                              array_to_string(enum_range(NULL::arm.file_type), ', '))
             END),
            (7, 'consolidation_id',
             CASE WHEN e.f->>'consolidation_id' IS NOT NULL
                   AND e.f->>'consolidation_id' !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                  THEN format('%L is not a uuid', e.f->>'consolidation_id') END),
            (8, 'bucket_role',
             CASE WHEN e.f->>'bucket_role' IS NOT NULL
                   AND NOT (e.f->>'bucket_role' = ANY (enum_range(NULL::arm.bucket_role)::text[]))
                  THEN format('%L is not a bucket role', e.f->>'bucket_role') END)
        ) AS c(ord, field, problem)
        WHERE c.problem IS NOT NULL AND c.field IS NOT NULL
        ORDER BY c.ord LIMIT 1
    ) p
    ORDER BY e.i
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'upload: file % of %: % %', v_bad.i, jsonb_array_length(p_files),
            v_bad.field, v_bad.problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = v_bad.field;
    END IF;

    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT e.i::integer AS i, gen_random_uuid() AS obj_id, gen_random_uuid() AS f_id,
               gen_random_uuid() AS j_id, r.*
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
        -- pipeline and max_attempts: the defaults trigger, as for the plain-SQL upload.
        INSERT INTO arm.recognition_job (id, file_id, attempt)
        SELECT input.j_id, input.f_id, 1
        FROM input JOIN f ON f.id = input.f_id ORDER BY input.i
        RETURNING id
    )
    SELECT input.i, input.f_id, input.j_id
    FROM input JOIN j ON j.id = input.j_id ORDER BY input.i;
END;
$$;

-- One file: the same rows and the same statement shape as arm.upload_files (one INSERT
-- per table in one WITH, the ids drawn first), the same checks in the same words, but
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
    v_field text;
    v_problem text;
    v_file uuid := gen_random_uuid();
    v_job uuid := gen_random_uuid();
BEGIN
    IF coalesce(p_bucket, '') = '' THEN
        v_field := 'bucket'; v_problem := 'must not be empty';
    ELSIF coalesce(p_key, '') = '' THEN
        v_field := 'key'; v_problem := 'must not be empty';
    ELSIF coalesce(p_original_name, '') = '' THEN
        v_field := 'original_name'; v_problem := 'must not be empty';
    ELSIF p_file_type IS NULL THEN
        v_field := 'file_type'; v_problem := 'must be given';
    ELSIF NOT (p_file_type = ANY (enum_range(NULL::arm.file_type)::text[])) THEN
        v_field := 'file_type';
        v_problem := format('%L is not a file type (%s)', p_file_type,
                            array_to_string(enum_range(NULL::arm.file_type), ', '));
    ELSIF p_bucket_role IS NOT NULL
          AND NOT (p_bucket_role = ANY (enum_range(NULL::arm.bucket_role)::text[])) THEN
        v_field := 'bucket_role';
        v_problem := format('%L is not a bucket role', p_bucket_role);
    END IF;
    IF v_field IS NOT NULL THEN
        RAISE EXCEPTION 'upload: % %', v_field, v_problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = v_field;
    END IF;

    WITH o AS (
        INSERT INTO arm.s3_object (id, bucket, key, bucket_role, created_by)
        VALUES (gen_random_uuid(), p_bucket, p_key,
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
    INSERT INTO arm.recognition_job (id, file_id, attempt)
    SELECT v_job, f.id, 1 FROM f;
    RETURN QUERY SELECT v_file, v_job;
END;
$$;
