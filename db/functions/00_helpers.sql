-- Small helpers shared by the other function files.
--
-- Owners, search_path and grants (db/grants.sql, db/README.md): every function that
-- writes, and every SECURITY DEFINER one, carries SET search_path = pg_catalog, arm,
-- pg_temp, so a caller's own schemas, functions and operators never reach its body.
-- The read-only helpers below but set_setting (is_final, pipeline_for, setting_int,
-- _request_body, _request_text, nats_message_bytes, envelope_problem, upload_problem) have
-- no SET clause on purpose: they are called once per row inside the hot functions, where a
-- SET would stop the SQL ones from being inlined; they write nothing, run with their
-- caller's rights, stay executable by PUBLIC, and resolve names under the path their
-- (pinned) caller runs with.

-- A new time-ordered id (UUID version 7, RFC 9562): Unix milliseconds in the first 48
-- bits, then version 7, the variant and random bits. The default id of a new object, file
-- and job (migration 0013 says why: index locality), and what the upload and inbox
-- functions draw. Ids drawn in the same millisecond are ordered at random among
-- themselves; nothing orders by id alone. PL/pgSQL, not SQL: a SQL function is inlined
-- into the statement that calls it, so every plain INSERT planned afresh (upstream's
-- four-statement upload, sent unprepared) parsed this body again, three times per file,
-- about a tenth of that upload's time; PL/pgSQL compiles it once per session. Every name
-- is qualified, so it needs no SET search_path (which costs a GUC save and restore per
-- call).
CREATE OR REPLACE FUNCTION arm.uuid_v7()
RETURNS uuid
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    RETURN pg_catalog.encode(
        pg_catalog.set_bit(pg_catalog.set_bit(
            pg_catalog.overlay(
                pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
                pg_catalog.substr(pg_catalog.int8send(pg_catalog.floor(
                    pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000
                )::pg_catalog.int8), 3),
                1, 6),
            52, 1), 53, 1),
        'hex')::pg_catalog.uuid;
END
$$;

-- Whether a job status is final: a final job's status, result and error never change.
CREATE OR REPLACE FUNCTION arm.is_final(p_status arm.job_status)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_status IN ('done', 'needs_check', 'error', 'timeout', 'dlq')
$$;

-- The pipeline a file type is recognised by: spreadsheets → tabular, scans → image.
CREATE OR REPLACE FUNCTION arm.pipeline_for(p_file_type arm.file_type)
RETURNS arm.pipeline
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_file_type IN ('XLS', 'XLSX', 'XLSB')
                THEN 'tabular'::arm.pipeline
                ELSE 'image'::arm.pipeline END
$$;

-- An integer setting from arm.setting; raises, naming the setting, when it is missing
-- or not an integer. The value is checked before the cast, not caught after it: an
-- EXCEPTION block starts a subtransaction on every call, and this runs in every upload
-- (every upload reads default_max_attempts), where it cost about 50 µs of ~0.9 ms.
CREATE OR REPLACE FUNCTION arm.setting_int(p_name text)
RETURNS integer
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_value text;
BEGIN
    SELECT value INTO v_value FROM arm.setting WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'arm.setting % is missing', p_name USING ERRCODE = 'no_data_found';
    END IF;
    -- What integer input accepts: blanks around an optional sign and decimal digits,
    -- within int4's range (at most 10 significant digits, cast to bigint to compare).
    IF v_value ~ '^\s*[+-]?0*[0-9]{1,10}\s*$' THEN
        IF v_value::bigint BETWEEN -2147483648 AND 2147483647 THEN
            RETURN v_value::integer;
        END IF;
    END IF;
    RAISE EXCEPTION 'arm.setting % is not an integer: %', p_name, v_value
        USING ERRCODE = 'invalid_parameter_value';
END;
$$;

-- Sets a setting (used by `arm-core migrate` from the environment; DBAs may call it).
CREATE OR REPLACE FUNCTION arm.set_setting(p_name text, p_value text)
RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
    INSERT INTO arm.setting (name, value) VALUES (p_name, p_value)
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
$$;

-- The request message v1.0 (docs/contracts/recognition-request.schema.json) for a job,
-- built from recognition_job ⋈ stored_file ⋈ s3_object, with the given reply deadline.
CREATE OR REPLACE FUNCTION arm._request_body(
    p_job arm.recognition_job,
    p_file arm.stored_file,
    p_source arm.s3_object,
    p_reply_deadline timestamptz
)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT jsonb_build_object(
        'schema_version', '1.0',
        'job_id', p_job.id,
        'file_id', p_file.id,
        'pipeline', p_job.pipeline,
        'file_type', p_file.file_type,
        'original_name', p_file.original_name,
        's3', jsonb_build_object('bucket', p_source.bucket, 'key', p_source.key),
        'reply_deadline',
            to_char(p_reply_deadline AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
        'attempt', p_job.attempt
    )
$$;

-- The same request as JSON text, from the columns it needs: byte for byte
-- _request_body(…)::text — jsonb's output (keys shortest first, then bytewise; ", " and
-- ": " between; strings escaped as to_json escapes them), so a republish, which prints
-- _request_body, sends exactly what the publish sent. Concatenated instead of building a
-- jsonb value and printing it: about 7 µs a row instead of 25, in the claim
-- (publish_queued_jobs_v2), PostgreSQL's largest cost per published job. Scalar
-- arguments, each used once, and STABLE like to_char: it is inlined into the claim. A
-- test keeps the two equal for names with quotes, backslashes, control characters and
-- non-ASCII text.
CREATE OR REPLACE FUNCTION arm._request_text(
    p_job_id uuid,
    p_file_id uuid,
    p_pipeline arm.pipeline,
    p_file_type arm.file_type,
    p_original_name text,
    p_bucket text,
    p_key text,
    p_reply_deadline timestamptz,
    p_attempt integer
)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT '{"s3": {"key": ' || to_json(p_key)::text
        || ', "bucket": ' || to_json(p_bucket)::text
        || '}, "job_id": "' || p_job_id::text
        || '", "attempt": ' || p_attempt::text
        || ', "file_id": "' || p_file_id::text
        || '", "pipeline": "' || p_pipeline::text
        || '", "file_type": "' || p_file_type::text
        || '", "original_name": ' || to_json(p_original_name)::text
        || ', "reply_deadline": "'
        || to_char(p_reply_deadline AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
        || '", "schema_version": "1.0"}'
$$;

-- What the NATS server counts against its max_payload for a request published with
-- nats-py and a Nats-Msg-Id header: the payload and the header block nats-py sends with
-- it, "NATS/1.0\r\nNats-Msg-Id: <id>\r\n\r\n". The one place this rule is written:
-- publish_queued_jobs_v2 dead-letters a request over the limit with it, and the
-- publisher's republish query (arm_core/queries.sql claim_unacked_jobs) returns it.
CREATE OR REPLACE FUNCTION arm.nats_message_bytes(p_payload text, p_msg_id text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT octet_length(p_payload)
           + octet_length(E'NATS/1.0\r\nNats-Msg-Id: ' || p_msg_id || E'\r\n\r\n')
$$;

-- What is wrong with one upload's fields (arm.upload_file's parameters, an element of
-- arm.upload_files' array), as {field, problem} — the first found, in this order — or
-- NULL: one set of rules in one set of words for both. The batch adds what only a JSON
-- element can get wrong (not an object, an unknown field, a consolidation_id that is not
-- a uuid). SQL and STABLE, so the CASE is inlined where it is called.
CREATE OR REPLACE FUNCTION arm.upload_problem(
    p_bucket text,
    p_key text,
    p_original_name text,
    p_file_type text,
    p_bucket_role text
)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN coalesce(p_bucket, '') = '' THEN ARRAY['bucket', 'must not be empty']
        WHEN coalesce(p_key, '') = '' THEN ARRAY['key', 'must not be empty']
        WHEN coalesce(p_original_name, '') = ''
            THEN ARRAY['original_name', 'must not be empty']
        WHEN p_file_type IS NULL THEN ARRAY['file_type', 'must be given']
        WHEN NOT (p_file_type = ANY (enum_range(NULL::arm.file_type)::text[]))
            THEN ARRAY['file_type', format('%L is not a file type (%s)', p_file_type,
                                           array_to_string(enum_range(NULL::arm.file_type), ', '))]
        WHEN p_bucket_role IS NOT NULL
             AND NOT (p_bucket_role = ANY (enum_range(NULL::arm.bucket_role)::text[]))
            THEN ARRAY['bucket_role', format('%L is not a bucket role', p_bucket_role)]
    END
$$;

-- Why the inbox refuses an answer (an ack or a result, as the fields of its envelope), or
-- NULL when it takes it: the one place these rules are written, for apply_envelopes_v2
-- (db/functions/30_inbox.sql) and the one-envelope oracle its tests compare it with
-- (tests/integration/inbox_oracle.sql). The text completes "element n …" (and the
-- oracle's "apply_result: the answer …"). An ack (`processing`) needs nothing more than
-- its ids.
CREATE OR REPLACE FUNCTION arm.envelope_problem(
    p_status text,
    p_msg_id text,
    p_error_code text,
    p_result_bucket text,
    p_result_key text,
    p_result_schema_version text
)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_status = 'processing' THEN NULL
        WHEN p_status IS NULL OR p_status NOT IN ('done', 'needs_check', 'error')
            THEN 'has status ' || coalesce(p_status, 'NULL')
                 || ', not processing, done, needs_check or error'
        WHEN coalesce(p_msg_id, '') = ''
            THEN 'is a result without the message''s Nats-Msg-Id'
        WHEN p_status = 'error' AND p_error_code IS NULL
            THEN 'is an error result; it needs an error code'
        WHEN p_status IN ('done', 'needs_check')
             AND (p_result_bucket IS NULL OR p_result_key IS NULL
                  OR p_result_schema_version IS NULL)
            THEN 'is a ' || p_status || ' result; it needs result_s3 and result_schema_version'
    END
$$;
