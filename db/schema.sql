-- db/schema.sql: schema arm as a fresh `arm-core migrate` leaves it (db/migrations,
-- then db/functions and db/grants.sql). Generated, do not edit: regenerate with
--     python -m arm_core.devtools.schema_snapshot --write
-- and review its diff with the change that caused it (db/README.md).
-- PostgreSQL 15, pg_dump 15 --schema-only --schema=arm

--
-- Name: arm; Type: SCHEMA; Schema: -; Owner: arm_owner
--

CREATE SCHEMA arm;


ALTER SCHEMA arm OWNER TO arm_owner;

--
-- Name: bucket_role; Type: TYPE; Schema: arm; Owner: arm_owner
--

CREATE TYPE arm.bucket_role AS ENUM (
    'uploads',
    'results',
    'raw'
);


ALTER TYPE arm.bucket_role OWNER TO arm_owner;

--
-- Name: file_status; Type: TYPE; Schema: arm; Owner: arm_owner
--

CREATE TYPE arm.file_status AS ENUM (
    'UPLOADED',
    'PROCESSING',
    'ERROR'
);


ALTER TYPE arm.file_status OWNER TO arm_owner;

--
-- Name: file_type; Type: TYPE; Schema: arm; Owner: arm_owner
--

CREATE TYPE arm.file_type AS ENUM (
    'XLS',
    'XLSX',
    'XLSB',
    'PDF',
    'PNG',
    'JPG'
);


ALTER TYPE arm.file_type OWNER TO arm_owner;

--
-- Name: job_status; Type: TYPE; Schema: arm; Owner: arm_owner
--

CREATE TYPE arm.job_status AS ENUM (
    'queued',
    'published',
    'processing',
    'done',
    'needs_check',
    'error',
    'timeout',
    'dlq'
);


ALTER TYPE arm.job_status OWNER TO arm_owner;

--
-- Name: pipeline; Type: TYPE; Schema: arm; Owner: arm_owner
--

CREATE TYPE arm.pipeline AS ENUM (
    'tabular',
    'image'
);


ALTER TYPE arm.pipeline OWNER TO arm_owner;

--
-- Name: _claim_fair(arm.pipeline, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm._claim_fair(p_pipeline arm.pipeline, p_n integer) RETURNS uuid[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
DECLARE
    v_ids uuid[] := '{}';
    v_got uuid[];
    v_lanes integer;
    v_want integer;
    v_repaired boolean := false;
BEGIN
    FOR round IN 1..6 LOOP
        v_want := p_n - cardinality(v_ids);
        EXIT WHEN v_want <= 0;
        SELECT count(*) INTO v_lanes
        FROM (SELECT 1 FROM arm.pace_lane l WHERE l.pipeline = p_pipeline LIMIT v_want) x;
        IF v_lanes = 0 THEN
            EXIT WHEN v_repaired;
            v_repaired := true;
            CONTINUE WHEN arm._repair_lanes(p_pipeline) > 0;
            EXIT;
        END IF;
        WITH lanes AS (
            SELECT l.lane, row_number() OVER (ORDER BY l.served_at, l.lane) AS lane_rank
            FROM arm.pace_lane l
            WHERE l.pipeline = p_pipeline
            ORDER BY l.served_at, l.lane
            LIMIT v_want
        ), candidates AS (
            SELECT lanes.lane, lanes.lane_rank, q.id, q.rn
            FROM lanes
            LEFT JOIN LATERAL (
                SELECT j.id, row_number() OVER (ORDER BY j.requested_at, j.id) AS rn
                FROM (
                    SELECT j.id, j.requested_at
                    FROM arm.recognition_job j
                    WHERE j.status = 'queued' AND j.pipeline = p_pipeline
                      AND j.lane = lanes.lane AND j.id <> ALL (v_ids)
                    ORDER BY j.requested_at, j.id
                    LIMIT ceil(v_want::numeric / v_lanes)::integer
                ) j
            ) q ON true
        ), dropped AS (
            DELETE FROM arm.pace_lane l
            USING candidates c
            WHERE l.pipeline = p_pipeline AND l.lane = c.lane AND c.id IS NULL
        )
        SELECT array_agg(c.id ORDER BY c.rn, c.lane_rank)
        INTO v_got
        FROM (SELECT * FROM candidates c WHERE c.id IS NOT NULL
              ORDER BY c.rn, c.lane_rank LIMIT v_want) c;
        IF v_got IS NULL THEN
            CONTINUE;  -- every lane looked at was empty (dropped): the next ones
        END IF;
        v_ids := v_ids || v_got;
    END LOOP;
    v_ids := ARRAY(SELECT j.id FROM arm.recognition_job j
                   WHERE j.id = ANY (v_ids) AND j.status = 'queued'
                   ORDER BY j.id
                   FOR UPDATE SKIP LOCKED);
    UPDATE arm.pace_lane l SET served_at = clock_timestamp()
    WHERE l.pipeline = p_pipeline
      AND l.lane IN (SELECT j.lane FROM arm.recognition_job j WHERE j.id = ANY (v_ids));
    RETURN v_ids;
END;
$$;


ALTER FUNCTION arm._claim_fair(p_pipeline arm.pipeline, p_n integer) OWNER TO arm_owner;

--
-- Name: _dead_letter_jobs(arm.job_status, uuid[], text[], text[]); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm._dead_letter_jobs(p_from arm.job_status, p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) RETURNS TABLE(job_id uuid, attempt integer, file_id uuid)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    IF cardinality(p_error_codes) IS DISTINCT FROM cardinality(p_job_ids)
       OR cardinality(p_error_messages) IS DISTINCT FROM cardinality(p_job_ids) THEN
        RAISE EXCEPTION 'dead-lettering takes one error code and one error message '
                        'per job id (% ids, % codes, % messages)',
            cardinality(p_job_ids), cardinality(p_error_codes), cardinality(p_error_messages)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_error_codes) AS c(code) WHERE coalesce(c.code, '') = '') THEN
        RAISE EXCEPTION 'dead-lettering needs an error code for every job'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    RETURN QUERY
    WITH wanted AS (
        SELECT DISTINCT ON (u.id) u.id, u.code, u.message
        FROM unnest(p_job_ids, p_error_codes, p_error_messages)
             WITH ORDINALITY AS u(id, code, message, n)
        WHERE u.id IS NOT NULL
        ORDER BY u.id, u.n
    ), locked AS (
        SELECT j.id, w.code, w.message
        FROM arm.recognition_job j
        JOIN wanted w ON w.id = j.id
        WHERE j.status = p_from
        ORDER BY j.id
        FOR UPDATE OF j
    ), moved AS (
        UPDATE arm.recognition_job j
        SET status = 'dlq',
            error_code = l.code,
            error_message = l.message,
            finished_at = clock_timestamp()
        FROM locked l
        WHERE j.id = l.id AND j.status = p_from
        RETURNING j.id, j.attempt, j.file_id
    ), files AS (
        UPDATE arm.stored_file f
        SET status = 'ERROR'
        FROM moved m
        WHERE f.id = m.file_id AND f.current_recognition_job_id = m.id
        RETURNING f.id
    )
    SELECT m.id, m.attempt, m.file_id FROM moved m;
END;
$$;


ALTER FUNCTION arm._dead_letter_jobs(p_from arm.job_status, p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) OWNER TO arm_owner;

--
-- Name: _pace_room(arm.pipeline, text, integer, integer, interval, interval, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm._pace_room(p_pipeline arm.pipeline, p_mode text, p_min integer, p_max integer, p_reply_timeout interval, p_ack_timeout interval, p_max_republish integer, OUT room integer, OUT probe boolean) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    c_base_floor CONSTANT double precision := 0.5;  -- seconds: see "queue" above
    -- The pipeline's row of arm.pipeline_pace; a record, as the table's type would have
    -- to exist when this function is made (a test applies these to an older schema).
    p record;
    v_in_flight integer;
    v_overdue integer;
    v_limit integer;
    v_window double precision;
    v_answers bigint;
    v_answer_seconds double precision;
    v_acks bigint;
    v_latency double precision;
    v_queue double precision;
    v_adaptive double precision;
BEGIN
    room := 0;
    probe := false;
    SELECT * INTO p FROM arm.pipeline_pace WHERE pipeline = p_pipeline FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT count(*)::integer,
           (count(*) FILTER (WHERE j.status = 'published'
                               AND j.last_published_at <= v_now - p_ack_timeout))::integer
    INTO v_in_flight, v_overdue
    FROM arm.recognition_job j
    WHERE j.pipeline = p_pipeline AND j.status IN ('published', 'processing');

    p.mode := p_mode;
    p.min_in_flight := p_min;
    p.max_in_flight := p_max;
    IF p_mode = 'auto' THEN
        <<adjust>>
        BEGIN
            v_window := extract(epoch FROM v_now - p.adjusted_at);
            v_adaptive := p.adaptive_limit;
            IF v_window < least(1.0, greatest(0.1, coalesce(p.min_latency_seconds, 0.1))) THEN
                EXIT adjust;
            END IF;
            WITH taken AS (
                DELETE FROM arm.pace_sample s WHERE s.pipeline = p.pipeline
                RETURNING s.answers, s.answer_seconds, s.acks
            )
            SELECT coalesce(sum(t.answers), 0), coalesce(sum(t.answer_seconds), 0),
                   coalesce(sum(t.acks), 0)
            INTO v_answers, v_answer_seconds, v_acks
            FROM taken t;

            IF v_answers + v_acks > 0 THEN
                p.answering := true;
                p.silent_since := NULL;
            ELSIF v_overdue > 0 THEN
                -- Published, an ack timeout ago, and nothing heard since the last window.
                IF p.answering THEN
                    p.silent_since := v_now;
                    p.probe_after := v_now + p_ack_timeout * (1 + p_max_republish);
                END IF;
                p.answering := false;
                v_adaptive := p.min_in_flight;
            END IF;

            IF v_answers > 0 THEN
                v_latency := v_answer_seconds / v_answers;
                p.latency_seconds := v_latency;
                p.answers_per_second := v_answers / v_window;
                p.min_latency_seconds := least(coalesce(p.min_latency_seconds, v_latency), v_latency);
                IF v_latency > 0.5 * extract(epoch FROM p_reply_timeout) THEN
                    v_adaptive := v_adaptive / 2;
                ELSIF v_in_flight >= v_adaptive / 2 AND v_latency > 0 THEN
                    v_queue := v_in_flight
                        * (1 - greatest(p.min_latency_seconds, c_base_floor) / v_latency);
                    IF v_queue < 1 THEN  -- by half per latency, as the shrink below
                        v_adaptive := v_adaptive
                            + greatest(1, v_adaptive / 2 * least(1.0, v_window / v_latency));
                    ELSIF v_queue < 3 THEN
                        v_adaptive := v_adaptive + 1;
                    ELSIF v_queue > 6 THEN
                        -- Half the excess per latency, spread over the windows in it: the
                        -- answers of a window left the service's queue a latency ago.
                        v_adaptive := v_adaptive
                            - (v_queue - 6) / 2 * least(1.0, v_window / v_latency);
                    END IF;
                END IF;
            ELSIF v_acks = 0 AND v_in_flight = 0 AND p.answering
                  AND v_window >= 3 * extract(epoch FROM p_ack_timeout) THEN
                v_adaptive := p.min_in_flight;  -- idle: start again from the floor
                p.answers_per_second := 0;
            ELSIF v_answers = 0 AND v_acks = 0 AND v_in_flight > 0 AND p.answering THEN
                EXIT adjust;  -- answers take longer than the window: keep gathering
            END IF;
            p.adaptive_limit := least(greatest(v_adaptive, p.min_in_flight, 1), p.max_in_flight);
            p.adjusted_at := v_now;
        END;
    ELSE
        p.adjusted_at := v_now;
    END IF;
    v_limit := CASE WHEN p.pinned_limit IS NOT NULL THEN p.pinned_limit
                    WHEN p_mode = 'fixed' THEN p_max
                    ELSE floor(p.adaptive_limit)::integer END;
    probe := false;
    IF p_mode = 'auto' AND p.pinned_limit IS NULL AND NOT p.answering THEN
        IF v_in_flight = 0 AND v_now >= coalesce(
                p.probe_after, p.silent_since + p_ack_timeout * (1 + p_max_republish)) THEN
            v_limit := 1;
            probe := true;
            p.probe_after := v_now + p_ack_timeout * (1 + p_max_republish);
        ELSE
            v_limit := 0;
        END IF;
    END IF;
    room := greatest(0, v_limit - v_in_flight);
    UPDATE arm.pipeline_pace SET
        mode = p.mode, min_in_flight = p.min_in_flight, max_in_flight = p.max_in_flight,
        adaptive_limit = p.adaptive_limit, latency_seconds = p.latency_seconds,
        min_latency_seconds = p.min_latency_seconds,
        answers_per_second = p.answers_per_second, answering = p.answering,
        silent_since = p.silent_since, probe_after = p.probe_after, adjusted_at = p.adjusted_at
    WHERE pipeline = p_pipeline;
END;
$$;


ALTER FUNCTION arm._pace_room(p_pipeline arm.pipeline, p_mode text, p_min integer, p_max integer, p_reply_timeout interval, p_ack_timeout interval, p_max_republish integer, OUT room integer, OUT probe boolean) OWNER TO arm_owner;

--
-- Name: _publish_claimed(uuid[], interval, interval, text, text, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm._publish_claimed(p_ids uuid[], p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer) RETURNS TABLE(job_id uuid, attempt integer, file_id uuid, outcome text, subject text, msg_id text, request text, error_message text, queued_seconds double precision)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_ids uuid[] := p_ids;
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    RETURN QUERY
    WITH built AS (
        SELECT j.id, j.file_id, j.attempt, j.requested_at,
               j.id::text || ':' || j.attempt AS msg_id,
               CASE j.pipeline WHEN 'tabular' THEN p_tabular_subject
                               ELSE p_image_subject END AS subject,
               d.deadline,
               arm._request_text(j.id, f.id, j.pipeline, f.file_type, f.original_name,
                                 o.bucket, o.key, d.deadline, j.attempt) AS request
        FROM arm.recognition_job j
        JOIN arm.stored_file f ON f.id = j.file_id
        JOIN arm.s3_object o ON o.id = f.s3_object_id
        CROSS JOIN LATERAL (
            SELECT date_trunc('milliseconds', v_now
                + CASE j.pipeline WHEN 'tabular' THEN p_tabular_reply_timeout
                                  ELSE p_image_reply_timeout END) AS deadline
        ) d
        WHERE j.id = ANY (v_ids)
    ), sized AS (
        -- What the server counts against max_payload (00_helpers.sql).
        SELECT b.*, arm.nats_message_bytes(b.request, b.msg_id) AS bytes
        FROM built b
    ), marked AS (
        UPDATE arm.recognition_job j
        SET status = CASE WHEN s.bytes <= p_max_bytes THEN 'published'
                          ELSE 'dlq' END::arm.job_status,
            published_at = CASE WHEN s.bytes <= p_max_bytes THEN v_now END,
            last_published_at = CASE WHEN s.bytes <= p_max_bytes THEN v_now END,
            request_msg_id = CASE WHEN s.bytes <= p_max_bytes THEN s.msg_id END,
            request_subject = CASE WHEN s.bytes <= p_max_bytes THEN s.subject END,
            reply_deadline = CASE WHEN s.bytes <= p_max_bytes THEN s.deadline END,
            error_code = CASE WHEN s.bytes > p_max_bytes THEN 'REQUEST_TOO_LARGE' END,
            error_message = CASE WHEN s.bytes > p_max_bytes THEN format(
                'the request is %s bytes; the NATS server accepts at most %s (max_payload)',
                s.bytes, p_max_bytes) END,
            finished_at = CASE WHEN s.bytes > p_max_bytes THEN v_now END
        FROM sized s
        WHERE j.id = s.id AND j.id = ANY (v_ids)
        RETURNING j.id, j.status, j.error_message, j.published_at
    ), files AS (
        UPDATE arm.stored_file f
        SET status = 'ERROR'
        FROM marked m JOIN sized s ON s.id = m.id
        WHERE m.status = 'dlq' AND f.id = s.file_id AND f.current_recognition_job_id = m.id
    )
    SELECT s.id, s.attempt, s.file_id, m.status::text,
           s.subject, s.msg_id,
           CASE WHEN m.status = 'published' THEN s.request END,
           m.error_message,
           extract(epoch FROM m.published_at - s.requested_at)::float8
    FROM sized s
    JOIN marked m ON m.id = s.id
    ORDER BY s.requested_at, s.id;
END;
$$;


ALTER FUNCTION arm._publish_claimed(p_ids uuid[], p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer) OWNER TO arm_owner;

--
-- Name: _repair_lanes(arm.pipeline); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm._repair_lanes(p_pipeline arm.pipeline) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
DECLARE
    v_added integer;
BEGIN
    WITH RECURSIVE l AS (
        (SELECT j.lane FROM arm.recognition_job j
         WHERE j.status = 'queued' AND j.pipeline = p_pipeline AND j.lane IS NOT NULL
         ORDER BY j.lane LIMIT 1)
        UNION ALL
        SELECT (SELECT j.lane FROM arm.recognition_job j
                WHERE j.status = 'queued' AND j.pipeline = p_pipeline AND j.lane > l.lane
                ORDER BY j.lane LIMIT 1)
        FROM l WHERE l.lane IS NOT NULL
    ), added AS (
        INSERT INTO arm.pace_lane (pipeline, lane)
        SELECT p_pipeline, l.lane FROM l WHERE l.lane IS NOT NULL
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO v_added FROM added;
    RETURN v_added;
END;
$$;


ALTER FUNCTION arm._repair_lanes(p_pipeline arm.pipeline) OWNER TO arm_owner;

--
-- Name: uuid_v7(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.uuid_v7() RETURNS uuid
    LANGUAGE plpgsql PARALLEL SAFE
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


ALTER FUNCTION arm.uuid_v7() OWNER TO arm_owner;


--
-- Name: recognition_job; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.recognition_job (
    id uuid DEFAULT arm.uuid_v7() NOT NULL,
    file_id uuid NOT NULL,
    pipeline arm.pipeline NOT NULL,
    attempt integer DEFAULT 1 NOT NULL,
    max_attempts integer NOT NULL,
    status arm.job_status DEFAULT 'queued'::arm.job_status NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    request_msg_id text,
    request_subject text,
    reply_deadline timestamp with time zone,
    republish_count integer DEFAULT 0 NOT NULL,
    last_published_at timestamp with time zone,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    service_name text,
    service_version text,
    metrics jsonb,
    error_code text,
    error_message text,
    result_schema_version text,
    result_s3_object_id uuid,
    result_msg_id text,
    group_schema jsonb,
    lane uuid,
    CONSTRAINT recognition_job_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT recognition_job_attempt_limit CHECK ((attempt <= max_attempts)),
    CONSTRAINT recognition_job_error_code CHECK (((status = ANY (ARRAY['error'::arm.job_status, 'timeout'::arm.job_status, 'dlq'::arm.job_status])) = (error_code IS NOT NULL))),
    CONSTRAINT recognition_job_error_message CHECK (((error_message IS NULL) OR (error_code IS NOT NULL))),
    CONSTRAINT recognition_job_finished_at CHECK (((status = ANY (ARRAY['done'::arm.job_status, 'needs_check'::arm.job_status, 'error'::arm.job_status, 'timeout'::arm.job_status, 'dlq'::arm.job_status])) = (finished_at IS NOT NULL))),
    CONSTRAINT recognition_job_group_schema CHECK (((group_schema IS NULL) OR (status = ANY (ARRAY['done'::arm.job_status, 'needs_check'::arm.job_status])))),
    CONSTRAINT recognition_job_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT recognition_job_no_result_while_live CHECK (((status <> ALL (ARRAY['queued'::arm.job_status, 'published'::arm.job_status, 'processing'::arm.job_status])) OR ((result_s3_object_id IS NULL) AND (metrics IS NULL) AND (result_schema_version IS NULL)))),
    CONSTRAINT recognition_job_not_started_yet CHECK (((status <> ALL (ARRAY['queued'::arm.job_status, 'published'::arm.job_status])) OR (started_at IS NULL))),
    CONSTRAINT recognition_job_published_fields CHECK ((((published_at IS NULL) = (request_msg_id IS NULL)) AND ((published_at IS NULL) = (request_subject IS NULL)) AND ((published_at IS NULL) = (reply_deadline IS NULL)) AND ((published_at IS NULL) = (last_published_at IS NULL)) AND ((status <> 'queued'::arm.job_status) OR (published_at IS NULL)) AND ((status = ANY (ARRAY['queued'::arm.job_status, 'dlq'::arm.job_status])) OR (published_at IS NOT NULL)))),
    CONSTRAINT recognition_job_republish_count_check CHECK ((republish_count >= 0)),
    CONSTRAINT recognition_job_republish_only_when_published CHECK (((republish_count = 0) OR (published_at IS NOT NULL))),
    CONSTRAINT recognition_job_result_msg_id CHECK (((status = ANY (ARRAY['done'::arm.job_status, 'needs_check'::arm.job_status, 'error'::arm.job_status])) = (result_msg_id IS NOT NULL))),
    CONSTRAINT recognition_job_result_object CHECK (((status <> ALL (ARRAY['done'::arm.job_status, 'needs_check'::arm.job_status])) OR ((result_s3_object_id IS NOT NULL) AND (result_schema_version IS NOT NULL)))),
    CONSTRAINT recognition_job_started_fields CHECK (((status <> 'processing'::arm.job_status) OR ((started_at IS NOT NULL) AND (service_name IS NOT NULL))))
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='5000');


ALTER TABLE arm.recognition_job OWNER TO arm_owner;

--
-- Name: s3_object; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.s3_object (
    id uuid DEFAULT arm.uuid_v7() NOT NULL,
    bucket text NOT NULL,
    key text NOT NULL,
    bucket_role arm.bucket_role NOT NULL,
    created_by text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT s3_object_bucket_check CHECK ((bucket <> ''::text)),
    CONSTRAINT s3_object_key_check CHECK ((key <> ''::text))
);


ALTER TABLE arm.s3_object OWNER TO arm_owner;

--
-- Name: stored_file; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.stored_file (
    id uuid DEFAULT arm.uuid_v7() NOT NULL,
    consolidation_id uuid,
    original_name text NOT NULL,
    file_type arm.file_type NOT NULL,
    s3_object_id uuid NOT NULL,
    status arm.file_status DEFAULT 'UPLOADED'::arm.file_status NOT NULL,
    current_recognition_job_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    failed boolean GENERATED ALWAYS AS ((status = 'ERROR'::arm.file_status)) STORED,
    CONSTRAINT stored_file_original_name_check CHECK ((original_name <> ''::text))
)
WITH (fillfactor='70');


ALTER TABLE arm.stored_file OWNER TO arm_owner;

--
-- Name: _request_body(arm.recognition_job, arm.stored_file, arm.s3_object, timestamp with time zone); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm._request_body(p_job arm.recognition_job, p_file arm.stored_file, p_source arm.s3_object, p_reply_deadline timestamp with time zone) RETURNS jsonb
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


ALTER FUNCTION arm._request_body(p_job arm.recognition_job, p_file arm.stored_file, p_source arm.s3_object, p_reply_deadline timestamp with time zone) OWNER TO arm_owner;

--
-- Name: _request_text(uuid, uuid, arm.pipeline, arm.file_type, text, text, text, timestamp with time zone, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm._request_text(p_job_id uuid, p_file_id uuid, p_pipeline arm.pipeline, p_file_type arm.file_type, p_original_name text, p_bucket text, p_key text, p_reply_deadline timestamp with time zone, p_attempt integer) RETURNS text
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


ALTER FUNCTION arm._request_text(p_job_id uuid, p_file_id uuid, p_pipeline arm.pipeline, p_file_type arm.file_type, p_original_name text, p_bucket text, p_key text, p_reply_deadline timestamp with time zone, p_attempt integer) OWNER TO arm_owner;

--
-- Name: apply_envelopes_v2(jsonb); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.apply_envelopes_v2(p_envelopes jsonb) RETURNS TABLE(ord integer, outcome text, attempt integer, status arm.job_status, wait_seconds double precision)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_named uuid[];
    v_locked uuid[];
    v_bad record;
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    IF jsonb_typeof(p_envelopes) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'apply_envelopes takes a JSON array of envelopes, not %',
            coalesce(jsonb_typeof(p_envelopes), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- What the inbox refuses, checked for the whole batch first (arm.envelope_problem is
    -- inlined here: one expression per element).
    SELECT b.n, b.problem
    INTO v_bad
    FROM (SELECT x.n,
                 arm.envelope_problem(x.env ->> 'status', x.env ->> 'msg_id',
                                      x.env ->> 'error_code', x.env ->> 'result_bucket',
                                      x.env ->> 'result_key',
                                      x.env ->> 'result_schema_version') AS problem
          FROM jsonb_array_elements(p_envelopes) WITH ORDINALITY AS x(env, n)) b
    WHERE b.problem IS NOT NULL
    ORDER BY b.n
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'apply_envelopes: element % %', v_bad.n, v_bad.problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Every job the batch names, then those of them this call holds. The jobs are read
    -- by primary key (id = ANY of an array, whose length the planner knows or, in the
    -- generic plan, takes as small): joined to the envelopes as a set, the planner
    -- expected a hundred of them and hashed all of recognition_job, final jobs included,
    -- twice per batch — a batch's cost grew with the history.
    v_named := ARRAY(SELECT DISTINCT (x.env ->> 'job_id')::uuid
                     FROM jsonb_array_elements(p_envelopes) AS x(env));
    v_locked := ARRAY(SELECT j.id FROM arm.recognition_job j
                      WHERE j.id = ANY (v_named)
                      ORDER BY j.id
                      FOR UPDATE SKIP LOCKED);

    RETURN QUERY
    WITH e AS (
        SELECT x.n::integer AS n, x.env,
               (x.env ->> 'job_id')::uuid AS job_id,
               (x.env ->> 'file_id')::uuid AS file_id,
               x.env ->> 'msg_id' AS msg_id,
               x.env ->> 'status' = 'processing' AS is_ack,
               j.id IS NOT NULL AS found,
               j.id = ANY (v_locked) AS held,
               j.file_id AS job_file_id, j.attempt AS job_attempt,
               j.status AS s0, j.result_msg_id AS m0
        FROM jsonb_array_elements(p_envelopes) WITH ORDINALITY AS x(env, n)
        LEFT JOIN arm.recognition_job j
               ON j.id = (x.env ->> 'job_id')::uuid AND j.id = ANY (v_named)
    ), c AS (
        -- Elements that act on their job: found, held, same file, the job not queued.
        SELECT e.*,
               e.found AND e.held AND e.file_id IS NOT DISTINCT FROM e.job_file_id
               AND e.s0 <> 'queued' AS acts
        FROM e
    ), first_result AS (
        -- The result that finishes a live job; arm.uuid_v7() (volatile) keeps this CTE
        -- evaluated once, so its object id is the same wherever it is read.
        SELECT DISTINCT ON (c.job_id)
               c.job_id, c.n AS r_n, c.env AS r_env, c.msg_id AS r_msg,
               (c.env ->> 'status')::arm.job_status AS r_status,
               CASE WHEN c.env ->> 'result_bucket' IS NOT NULL
                         AND c.env ->> 'result_key' IS NOT NULL
                    THEN arm.uuid_v7() END AS object_id
        FROM c
        WHERE c.acts AND NOT c.is_ack AND c.s0 IN ('published', 'processing')
        ORDER BY c.job_id, c.n
    ), first_ack AS (
        -- The ack that starts a published job: the first one, if before its result.
        SELECT DISTINCT ON (c.job_id) c.job_id, c.n AS a_n, c.env AS a_env
        FROM c
        LEFT JOIN first_result r ON r.job_id = c.job_id
        WHERE c.acts AND c.is_ack AND c.s0 = 'published' AND (r.r_n IS NULL OR c.n < r.r_n)
        ORDER BY c.job_id, c.n
    ), changed AS (
        SELECT c.job_id, c.job_file_id, a.a_n, a.a_env, r.r_n, r.r_env, r.r_status,
               r.r_msg, r.object_id
        FROM (SELECT DISTINCT job_id, job_file_id FROM c WHERE c.acts) c
        LEFT JOIN first_ack a ON a.job_id = c.job_id
        LEFT JOIN first_result r ON r.job_id = c.job_id
        WHERE a.a_n IS NOT NULL OR r.r_n IS NOT NULL
    ), objects AS (
        INSERT INTO arm.s3_object (id, bucket, key, bucket_role, created_by)
        SELECT ch.object_id, ch.r_env ->> 'result_bucket', ch.r_env ->> 'result_key',
               'results', ch.r_env ->> 'service_name'
        FROM changed ch
        WHERE ch.object_id IS NOT NULL
    ), jobs AS (
        UPDATE arm.recognition_job j
        SET status = coalesce(ch.r_status, 'processing'),
            started_at = CASE WHEN ch.a_n IS NOT NULL THEN v_now ELSE j.started_at END,
            service_name = coalesce(ch.r_env, ch.a_env) ->> 'service_name',
            service_version = coalesce(ch.r_env, ch.a_env) ->> 'service_version',
            finished_at = CASE WHEN ch.r_n IS NOT NULL THEN v_now END,
            metrics = CASE WHEN ch.r_n IS NOT NULL
                           THEN nullif(ch.r_env -> 'metrics', 'null'::jsonb) END,
            error_code = CASE WHEN ch.r_status = 'error' THEN ch.r_env ->> 'error_code' END,
            error_message = CASE WHEN ch.r_status = 'error'
                                 THEN ch.r_env ->> 'error_message' END,
            result_schema_version = ch.r_env ->> 'result_schema_version',
            result_s3_object_id = ch.object_id,
            result_msg_id = ch.r_msg
        FROM changed ch
        WHERE j.id = ch.job_id
        RETURNING j.id, j.pipeline, j.published_at, j.started_at, j.finished_at
    ), samples AS (
        -- What pacing adapts the in-flight limit from (22_pacing.sql): per pipeline, the
        -- answers and acks applied and how long after the publish they came.
        INSERT INTO arm.pace_sample (pipeline, answers, answer_seconds, acks, ack_seconds)
        SELECT u.pipeline,
               count(*) FILTER (WHERE ch.r_n IS NOT NULL),
               coalesce(sum(extract(epoch FROM u.finished_at - u.published_at))
                        FILTER (WHERE ch.r_n IS NOT NULL), 0),
               count(*) FILTER (WHERE ch.a_n IS NOT NULL),
               coalesce(sum(extract(epoch FROM u.started_at - u.published_at))
                        FILTER (WHERE ch.a_n IS NOT NULL), 0)
        FROM jobs u JOIN changed ch ON ch.job_id = u.id
        GROUP BY u.pipeline
    ), files AS (
        UPDATE arm.stored_file f
        SET status = CASE WHEN ch.r_status = 'error' THEN 'ERROR'
                          ELSE 'PROCESSING' END::arm.file_status
        FROM changed ch
        WHERE f.id = ch.job_file_id
          AND f.current_recognition_job_id = ch.job_id
          AND (ch.r_n IS NOT NULL OR f.status <> 'PROCESSING')
    )
    SELECT c.n,
           CASE
               WHEN NOT c.found THEN 'unknown_job'
               WHEN NOT c.held THEN 'busy'
               WHEN c.file_id IS DISTINCT FROM c.job_file_id THEN 'file_mismatch'
               WHEN c.s0 = 'queued' THEN 'not_published'
               WHEN c.is_ack THEN
                   CASE WHEN c.n = a.a_n THEN 'applied'
                        WHEN r.r_n < c.n OR arm.is_final(c.s0) THEN 'already_final'
                        ELSE 'duplicate' END
               WHEN arm.is_final(c.s0) THEN
                   CASE WHEN c.msg_id = c.m0 THEN 'duplicate' ELSE 'already_final' END
               WHEN c.n = r.r_n THEN 'applied'
               WHEN c.msg_id = r.r_msg THEN 'duplicate'
               ELSE 'already_final'
           END,
           CASE WHEN c.found AND c.held THEN c.job_attempt END,
           CASE
               WHEN NOT (c.found AND c.held) THEN NULL
               WHEN r.r_n <= c.n THEN r.r_status
               WHEN a.a_n <= c.n THEN 'processing'::arm.job_status
               ELSE c.s0
           END,
           -- The applied ack and the applied result are the first ones (above).
           CASE
               WHEN c.n = a.a_n THEN extract(epoch FROM u.started_at - u.published_at)
               WHEN c.n = r.r_n THEN extract(epoch FROM u.finished_at - u.started_at)
           END::float8
    FROM c
    LEFT JOIN first_ack a ON a.job_id = c.job_id
    LEFT JOIN first_result r ON r.job_id = c.job_id
    LEFT JOIN jobs u ON u.id = c.job_id
    ORDER BY c.n;
END;
$$;


ALTER FUNCTION arm.apply_envelopes_v2(p_envelopes jsonb) OWNER TO arm_owner;

--
-- Name: archive_files(timestamp with time zone, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.archive_files(p_finished_before timestamp with time zone, p_limit integer) RETURNS TABLE(files bigint, jobs bigint, retries bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
BEGIN
    IF p_finished_before IS NULL OR p_finished_before > now() - interval '1 day' THEN
        RAISE EXCEPTION 'archive_files keeps at least the last day: p_finished_before (%) must be a day ago or earlier',
            p_finished_before
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'archive_files moves at least one file a batch: p_limit is %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    RETURN QUERY
    WITH picked AS (
        -- Oldest first, through the file list's index on created_at.
        SELECT f.id
        FROM arm.stored_file f
        JOIN arm.recognition_job j ON j.id = f.current_recognition_job_id
        WHERE f.created_at < p_finished_before
          AND f.updated_at < p_finished_before
          AND arm.is_final(j.status)
          AND j.finished_at < p_finished_before
        ORDER BY f.created_at, f.id
        LIMIT p_limit
        FOR UPDATE OF f, j SKIP LOCKED
    ),
    -- One statement: the foreign keys between the three hot tables are checked at its end,
    -- when the file, its jobs and its retries are all gone.
    gone_retries AS (
        DELETE FROM arm.retry_audit a USING picked p WHERE a.file_id = p.id RETURNING a.*
    ),
    gone_jobs AS (
        DELETE FROM arm.recognition_job j USING picked p WHERE j.file_id = p.id RETURNING j.*
    ),
    gone_files AS (
        DELETE FROM arm.stored_file f USING picked p WHERE f.id = p.id RETURNING f.*
    ),
    kept_retries AS (
        INSERT INTO arm.archived_retry_audit
            (id, file_id, old_job_id, new_job_id, new_attempt, actor, retried_at,
             actor_level)
        SELECT id, file_id, old_job_id, new_job_id, new_attempt, actor, retried_at,
               actor_level
        FROM gone_retries
        RETURNING 1
    ),
    kept_jobs AS (
        INSERT INTO arm.archived_job SELECT * FROM gone_jobs RETURNING 1
    ),
    kept_files AS (
        INSERT INTO arm.archived_file
            (id, consolidation_id, original_name, file_type, s3_object_id, status,
             current_recognition_job_id, created_at, updated_at, archived_at)
        SELECT id, consolidation_id, original_name, file_type, s3_object_id, status,
               current_recognition_job_id, created_at, updated_at, now()
        FROM gone_files
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM kept_files), (SELECT count(*) FROM kept_jobs),
           (SELECT count(*) FROM kept_retries);
END;
$$;


ALTER FUNCTION arm.archive_files(p_finished_before timestamp with time zone, p_limit integer) OWNER TO arm_owner;

--
-- Name: bridge_instances(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.bridge_instances() RETURNS TABLE(name text, version text, started_at timestamp with time zone, seen_seconds_ago double precision, nats text, listener text, loops jsonb, held integer)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT b.name, b.version, b.started_at,
           extract(epoch FROM clock_timestamp() - b.seen_at)::double precision,
           b.nats, b.listener, b.loops, b.held
    FROM arm.bridge_instance b
    WHERE b.seen_at >= clock_timestamp() - interval '1 day'
    ORDER BY b.seen_at DESC, b.name;
END
$$;


ALTER FUNCTION arm.bridge_instances() OWNER TO arm_owner;

--
-- Name: claim_unacked_jobs(integer, interval, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.claim_unacked_jobs(p_limit integer, p_ack_timeout interval, p_max_republish integer) RETURNS TABLE(job_id uuid, attempt integer, subject text, msg_id text, republish_count integer, request jsonb)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_due_before timestamptz := clock_timestamp() - p_ack_timeout;
    -- Each batch starts after (v_after_at, v_after_id), the last row of the one before.
    v_after_at timestamptz := '-infinity';
    v_after_id uuid := '00000000-0000-0000-0000-000000000000';
    v_claimed integer := 0;
    v_batch uuid[];
BEGIN
    LOOP
        SELECT array_agg(d.id ORDER BY d.last_published_at, d.id), max(d.last_published_at)
        INTO v_batch, v_after_at
        FROM (
            SELECT j.id, j.last_published_at
            FROM arm.recognition_job j
            WHERE j.status = 'published'
              AND j.last_published_at <= v_due_before
              AND (j.last_published_at, j.id) > (v_after_at, v_after_id)
              AND j.republish_count < p_max_republish
            ORDER BY j.last_published_at, j.id
            -- At most a batch (keep in step with the EXIT below); NULL p_limit: no limit.
            LIMIT least(p_limit - v_claimed, 1000)
            FOR UPDATE SKIP LOCKED
        ) d;
        EXIT WHEN v_batch IS NULL;
        v_after_id := v_batch[cardinality(v_batch)];
        v_claimed := v_claimed + cardinality(v_batch);

        RETURN QUERY
        SELECT j.id, j.attempt, j.request_subject, j.request_msg_id, j.republish_count,
               arm._request_body(j, f, o, j.reply_deadline)
        FROM arm.recognition_job j
        JOIN arm.stored_file f ON f.id = j.file_id
        JOIN arm.s3_object o ON o.id = f.s3_object_id
        WHERE j.id = ANY (v_batch)
        ORDER BY j.last_published_at, j.id;

        EXIT WHEN cardinality(v_batch) < 1000 OR v_claimed >= p_limit;
    END LOOP;
END;
$$;


ALTER FUNCTION arm.claim_unacked_jobs(p_limit integer, p_ack_timeout interval, p_max_republish integer) OWNER TO arm_owner;

--
-- Name: compact_counts(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.compact_counts() RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.compact_counts() OWNER TO arm_owner;

--
-- Name: dead_letter_unacked(interval, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.dead_letter_unacked(p_ack_timeout interval, p_max_republish integer) RETURNS TABLE(job_id uuid, attempt integer, file_id uuid, republish_count integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_due_before timestamptz := clock_timestamp() - p_ack_timeout;
    -- Each batch starts after (v_after_at, v_after_id), the last row of the one before.
    v_after_at timestamptz := '-infinity';
    v_after_id uuid := '00000000-0000-0000-0000-000000000000';
    v_due uuid[];
    v_jobs uuid[];
    v_attempts integer[];
    v_files uuid[];
    v_republished integer[];
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    LOOP
        SELECT array_agg(d.id ORDER BY d.last_published_at, d.id), max(d.last_published_at)
        INTO v_due, v_after_at
        FROM (
            SELECT j.id, j.last_published_at
            FROM arm.recognition_job j
            WHERE j.status = 'published'
              AND j.last_published_at <= v_due_before
              AND (j.last_published_at, j.id) > (v_after_at, v_after_id)
              AND j.republish_count >= p_max_republish
            ORDER BY j.last_published_at, j.id
            LIMIT 1000  -- the batch; keep in step with the EXIT below
            FOR UPDATE SKIP LOCKED
        ) d;
        EXIT WHEN v_due IS NULL;
        v_after_id := v_due[cardinality(v_due)];

        WITH moved AS (
            UPDATE arm.recognition_job j
            SET status = 'dlq',
                error_code = 'NO_ACK',
                error_message = format('no ack after %s publishes', j.republish_count + 1),
                finished_at = clock_timestamp()
            WHERE j.id = ANY (v_due) AND j.status = 'published'
            RETURNING j.id, j.attempt, j.file_id, j.republish_count
        )
        SELECT array_agg(m.id), array_agg(m.attempt), array_agg(m.file_id),
               array_agg(m.republish_count)
        INTO v_jobs, v_attempts, v_files, v_republished
        FROM moved m;

        UPDATE arm.stored_file f
        SET status = 'ERROR'
        WHERE f.id = ANY (v_files)
          AND f.current_recognition_job_id = ANY (v_jobs);

        RETURN QUERY SELECT * FROM unnest(v_jobs, v_attempts, v_files, v_republished);
        EXIT WHEN cardinality(v_due) < 1000;
    END LOOP;
END;
$$;


ALTER FUNCTION arm.dead_letter_unacked(p_ack_timeout interval, p_max_republish integer) OWNER TO arm_owner;

--
-- Name: dead_letter_unpublishable(uuid[], text[], text[]); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.dead_letter_unpublishable(p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) RETURNS TABLE(job_id uuid, attempt integer, file_id uuid)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
    SELECT * FROM arm._dead_letter_jobs('queued', p_job_ids, p_error_codes, p_error_messages)
$$;


ALTER FUNCTION arm.dead_letter_unpublishable(p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) OWNER TO arm_owner;

--
-- Name: dead_letter_unrepublishable(uuid[], text[], text[]); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.dead_letter_unrepublishable(p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) RETURNS TABLE(job_id uuid, attempt integer, file_id uuid)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
    SELECT * FROM arm._dead_letter_jobs('published', p_job_ids, p_error_codes, p_error_messages)
$$;


ALTER FUNCTION arm.dead_letter_unrepublishable(p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) OWNER TO arm_owner;

--
-- Name: envelope_problem(text, text, text, text, text, text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.envelope_problem(p_status text, p_msg_id text, p_error_code text, p_result_bucket text, p_result_key text, p_result_schema_version text) RETURNS text
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


ALTER FUNCTION arm.envelope_problem(p_status text, p_msg_id text, p_error_code text, p_result_bucket text, p_result_key text, p_result_schema_version text) OWNER TO arm_owner;

--
-- Name: file_counts(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.file_counts() RETURNS TABLE(status text, n bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.file_counts() OWNER TO arm_owner;

--
-- Name: fold_name(text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.fold_name(p_name text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT pg_catalog.lower(pg_catalog.translate(p_name,
        'АБВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯЀЁЂЃЄЅІЇЈЉЊЋЌЍЎЏҐÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖØÙÚÛÜÝÞΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ',
        'абвгдежзийклмнопрстуфхцчшщъыьэюяѐёђѓєѕіїјљњћќѝўџґàáâãäåæçèéêëìíîïðñòóôõöøùúûüýþαβγδεζηθικλμνξοπρστυφχψω')
        COLLATE "C")
$$;


ALTER FUNCTION arm.fold_name(p_name text) OWNER TO arm_owner;

--
-- Name: forget_bridge(text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.forget_bridge(p_name text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM arm.bridge_instance WHERE name = p_name;
    RETURN FOUND;
END
$$;


ALTER FUNCTION arm.forget_bridge(p_name text) OWNER TO arm_owner;

--
-- Name: get_file(uuid); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.get_file(p_file_id uuid) RETURNS jsonb
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
BEGIN
    RETURN (
    WITH hot AS (
        SELECT f, NULL::timestamptz AS archived_at FROM arm.stored_file f WHERE f.id = p_file_id
    ),
    one AS (
        SELECT * FROM hot
        UNION ALL
        SELECT jsonb_populate_record(NULL::arm.stored_file, to_jsonb(a)), a.archived_at
        FROM arm.archived_file a
        WHERE a.id = p_file_id AND NOT EXISTS (SELECT FROM hot)
    ),
    jobs AS (
        SELECT j FROM arm.recognition_job j WHERE j.file_id = p_file_id
        UNION ALL
        SELECT jsonb_populate_record(NULL::arm.recognition_job, to_jsonb(a))
        FROM arm.archived_job a WHERE a.file_id = p_file_id
    ),
    -- The retry audit (arm.retry_audit, written by retry_file_v3): who retried, with
    -- which access level (NULL: none recorded, a DBA's SQL or an older retry), when, from
    -- which job to which.
    retries AS (
        SELECT a.id, a.actor, a.actor_level, a.retried_at, a.old_job_id, a.new_job_id,
               a.new_attempt
        FROM arm.retry_audit a WHERE a.file_id = p_file_id
        UNION ALL
        SELECT a.id, a.actor, a.actor_level, a.retried_at, a.old_job_id, a.new_job_id,
               a.new_attempt
        FROM arm.archived_retry_audit a WHERE a.file_id = p_file_id
    )
    SELECT jsonb_build_object(
        'file', jsonb_build_object(
            'id', (one.f).id,
            'consolidation_id', (one.f).consolidation_id,
            'original_name', (one.f).original_name,
            'file_type', (one.f).file_type,
            'status', (one.f).status,
            's3', jsonb_build_object('bucket', o.bucket, 'key', o.key),
            'current_job_id', (one.f).current_recognition_job_id,
            'created_at', (one.f).created_at,
            'updated_at', (one.f).updated_at,
            'archived_at', one.archived_at
        ),
        'current_job', (SELECT arm.job_view(jobs.j) FROM jobs
                        WHERE (jobs.j).id = (one.f).current_recognition_job_id),
        'attempts', coalesce((SELECT jsonb_agg(arm.job_view(jobs.j) ORDER BY (jobs.j).attempt)
                              FROM jobs), '[]'::jsonb),
        -- Oldest first.
        'retries', coalesce((SELECT jsonb_agg(jsonb_build_object(
                                 'actor', r.actor,
                                 'actor_level', r.actor_level,
                                 'retried_at', r.retried_at,
                                 'old_job_id', r.old_job_id,
                                 'new_job_id', r.new_job_id,
                                 'new_attempt', r.new_attempt) ORDER BY r.retried_at, r.id)
                             FROM retries r), '[]'::jsonb)
    )
    FROM one
    JOIN arm.s3_object o ON o.id = (one.f).s3_object_id
    );
END;
$$;


ALTER FUNCTION arm.get_file(p_file_id uuid) OWNER TO arm_owner;

--
-- Name: is_final(arm.job_status); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.is_final(p_status arm.job_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT p_status IN ('done', 'needs_check', 'error', 'timeout', 'dlq')
$$;


ALTER FUNCTION arm.is_final(p_status arm.job_status) OWNER TO arm_owner;

--
-- Name: is_retryable(arm.job_status, integer, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.is_retryable(p_status arm.job_status, p_attempt integer, p_max_attempts integer) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT coalesce(p_status IN ('error', 'timeout', 'dlq') AND p_attempt < p_max_attempts,
                    false)
$$;


ALTER FUNCTION arm.is_retryable(p_status arm.job_status, p_attempt integer, p_max_attempts integer) OWNER TO arm_owner;

--
-- Name: job_counts(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.job_counts() RETURNS TABLE(status text, n bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.job_counts() OWNER TO arm_owner;

--
-- Name: job_view(arm.recognition_job); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.job_view(j arm.recognition_job) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT jsonb_build_object(
        'job_id', j.id,
        'attempt', j.attempt,
        'max_attempts', j.max_attempts,
        'pipeline', j.pipeline,
        'status', j.status,
        'requested_at', j.requested_at,
        'published_at', j.published_at,
        'reply_deadline', j.reply_deadline,
        'started_at', j.started_at,
        'finished_at', j.finished_at,
        'request_msg_id', j.request_msg_id,
        'republish_count', j.republish_count,
        'service', CASE WHEN j.service_name IS NOT NULL THEN
            jsonb_build_object('name', j.service_name, 'version', j.service_version) END,
        'error', CASE WHEN j.error_code IS NOT NULL THEN
            jsonb_build_object('code', j.error_code, 'message', j.error_message) END,
        'result', (SELECT jsonb_build_object('bucket', o.bucket, 'key', o.key,
                                             'schema_version', j.result_schema_version,
                                             'msg_id', j.result_msg_id)
                   FROM arm.s3_object o WHERE o.id = j.result_s3_object_id),
        'metrics', j.metrics
    )
$$;


ALTER FUNCTION arm.job_view(j arm.recognition_job) OWNER TO arm_owner;

--
-- Name: list_files(integer, timestamp with time zone, uuid, arm.file_status[], arm.job_status[], uuid, arm.file_type[], text, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.list_files(p_limit integer, p_after_created_at timestamp with time zone DEFAULT NULL::timestamp with time zone, p_after_id uuid DEFAULT NULL::uuid, p_statuses arm.file_status[] DEFAULT NULL::arm.file_status[], p_job_statuses arm.job_status[] DEFAULT NULL::arm.job_status[], p_consolidation_id uuid DEFAULT NULL::uuid, p_file_types arm.file_type[] DEFAULT NULL::arm.file_type[], p_q text DEFAULT NULL::text, p_updated_after timestamp with time zone DEFAULT NULL::timestamp with time zone, p_updated_before timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(id uuid, consolidation_id uuid, original_name text, file_type arm.file_type, status arm.file_status, s3_bucket text, s3_key text, created_at timestamp with time zone, updated_at timestamp with time zone, job_id uuid, job_status arm.job_status, attempt integer, max_attempts integer, error_code text, retryable boolean)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $_$
DECLARE
    v_where text := '';
    v_page text;
    v_cap integer := 200;  -- Q_CAP
    v_matches uuid[];
    v_folded text;
    v_others arm.file_status[];
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1001 THEN
        RAISE EXCEPTION 'list_files: p_limit must be 1..1001, not %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (p_after_created_at IS NULL) <> (p_after_id IS NULL) THEN
        RAISE EXCEPTION 'list_files: the keyset needs both p_after_created_at and p_after_id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF p_after_created_at IS NOT NULL THEN
        v_where := v_where || ' AND (f.created_at, f.id) < ($1, $2)';
    END IF;
    IF p_job_statuses IS NOT NULL THEN
        -- A subquery per row walked (the job's primary key), never a join the planner
        -- could turn into a hash of every job.
        v_where := v_where || ' AND (SELECT cj.status FROM arm.recognition_job cj'
            || ' WHERE cj.id = f.current_recognition_job_id) = ANY ($4)';
    END IF;
    IF p_consolidation_id IS NOT NULL THEN
        v_where := v_where || ' AND f.consolidation_id = $5';
    END IF;
    IF p_file_types IS NOT NULL THEN
        v_where := v_where || ' AND f.file_type = ANY ($6)';
    END IF;
    IF p_updated_after IS NOT NULL THEN
        v_where := v_where || ' AND f.updated_at > $8';
    END IF;
    IF p_updated_before IS NOT NULL THEN
        v_where := v_where || ' AND f.updated_at < $9';
    END IF;

    -- q: the ids of its matches through the trigram index when they are few (the header).
    v_folded := arm.fold_name(p_q);
    IF pg_catalog.length(v_folded) >= 3 AND v_folded ~ '[[:alnum:]]{3}'
       AND pg_catalog.to_regclass('arm.stored_file_name_trgm_idx') IS NOT NULL THEN
        IF pg_catalog.current_setting('arm.list_files_q_cap', true) ~ '^[0-9]{1,9}$' THEN
            v_cap := pg_catalog.current_setting('arm.list_files_q_cap', true)::integer;
        END IF;
        -- EXECUTE: planned with this q's pattern (a generic plan could not estimate it).
        -- The regular expression finds the same names (the header) and costs a twentieth
        -- of folding one: where the planner reads the table instead (q common), a name
        -- is folded only when it matches.
        EXECUTE 'SELECT array_agg(m.id) FROM (SELECT f.id FROM arm.stored_file f'
            || ' WHERE arm.fold_name(f.original_name) LIKE $1'
            || ' AND f.original_name COLLATE "C" ~ $3 LIMIT $2) m'
        INTO v_matches
        USING '%' || pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
                  v_folded, E'\\', E'\\\\'), '%', E'\\%'), '_', E'\\_') || '%',
              v_cap + 1, arm.name_pattern(p_q);
        IF coalesce(pg_catalog.cardinality(v_matches), 0) > v_cap THEN
            v_matches := NULL;
        ELSE
            v_matches := coalesce(v_matches, '{}');
        END IF;
    END IF;
    IF p_q IS NOT NULL AND v_matches IS NULL THEN
        v_where := v_where || ' AND f.original_name COLLATE "C" ~ $7';
    END IF;

    IF v_matches IS NOT NULL THEN
        -- The few matches by primary key, filtered, sorted, limited.
        v_page := 'SELECT f.* FROM arm.stored_file f WHERE f.id = ANY ($11)'
            || CASE WHEN p_statuses IS NULL THEN '' ELSE ' AND f.status = ANY ($3)' END
            || v_where || ' ORDER BY f.created_at DESC, f.id DESC LIMIT $10';
    ELSIF p_statuses IS NULL THEN
        v_page := 'SELECT f.* FROM arm.stored_file f WHERE true' || v_where
            || ' ORDER BY f.created_at DESC, f.id DESC LIMIT $10';
    ELSE
        -- ERROR, the rare one: its partial index (stored_file_failed_created_idx, on the
        -- generated `failed`: migration 0008), walked from its newest entry. The others
        -- (PROCESSING is most files, UPLOADED the newest ones): the walk of
        -- stored_file_created_idx, filtered. Each stops at p_limit; then the merge.
        v_others := ARRAY(SELECT DISTINCT s FROM unnest(p_statuses) s WHERE s <> 'ERROR');
        v_page := 'SELECT p.* FROM ('
            || CASE WHEN 'ERROR' = ANY (p_statuses) THEN
                   '(SELECT f.* FROM arm.stored_file f WHERE f.failed' || v_where
                   || ' ORDER BY f.created_at DESC, f.id DESC LIMIT $10)'
               ELSE '' END
            || CASE WHEN 'ERROR' = ANY (p_statuses) AND cardinality(v_others) > 0
                    THEN ' UNION ALL ' ELSE '' END
            || CASE WHEN cardinality(v_others) > 0 THEN
                   '(SELECT f.* FROM arm.stored_file f WHERE f.status = ANY ($12)' || v_where
                   || ' ORDER BY f.created_at DESC, f.id DESC LIMIT $10)'
               ELSE '' END
            || ') p ORDER BY p.created_at DESC, p.id DESC LIMIT $10';
    END IF;

    RETURN QUERY EXECUTE
        'SELECT f.id, f.consolidation_id, f.original_name, f.file_type, f.status,'
        || ' o.bucket, o.key, f.created_at, f.updated_at,'
        || ' j.id, j.status, j.attempt, j.max_attempts, j.error_code,'
        || ' arm.is_retryable(j.status, j.attempt, j.max_attempts)'
        || ' FROM (' || v_page || ') f'
        -- LATERAL … LIMIT 1: one primary-key lookup per file of the page (a plain join
        -- may be planned as a hash of the whole table).
        || ' CROSS JOIN LATERAL (SELECT o.bucket, o.key FROM arm.s3_object o'
        || ' WHERE o.id = f.s3_object_id LIMIT 1) o'
        || ' LEFT JOIN LATERAL (SELECT j.id, j.status, j.attempt, j.max_attempts, j.error_code'
        || ' FROM arm.recognition_job j WHERE j.id = f.current_recognition_job_id LIMIT 1) j'
        || ' ON true'
        || ' ORDER BY f.created_at DESC, f.id DESC'
    USING p_after_created_at, p_after_id, p_statuses, p_job_statuses, p_consolidation_id,
          p_file_types, arm.name_pattern(p_q), p_updated_after, p_updated_before, p_limit,
          v_matches, v_others;
END;
$_$;


ALTER FUNCTION arm.list_files(p_limit integer, p_after_created_at timestamp with time zone, p_after_id uuid, p_statuses arm.file_status[], p_job_statuses arm.job_status[], p_consolidation_id uuid, p_file_types arm.file_type[], p_q text, p_updated_after timestamp with time zone, p_updated_before timestamp with time zone) OWNER TO arm_owner;

--
-- Name: mark_republished(uuid[]); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.mark_republished(p_job_ids uuid[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
DECLARE
    v_count integer;
BEGIN
    UPDATE arm.recognition_job
    SET republish_count = republish_count + 1,
        last_published_at = clock_timestamp()
    WHERE id = ANY (p_job_ids)
      AND status = 'published';
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;


ALTER FUNCTION arm.mark_republished(p_job_ids uuid[]) OWNER TO arm_owner;

--
-- Name: name_pattern(text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.name_pattern(p_q text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $_$
    SELECT coalesce(string_agg(
        CASE WHEN x.low <> x.up THEN '[' || x.low || x.up || ']'
             WHEN x.c COLLATE "C" ~ '^[0-9A-Za-z]$' THEN x.c
             ELSE E'\\' || x.c END, '' ORDER BY x.i), '')
    FROM (SELECT s.i, s.c, arm.fold_name(s.c) AS low,
                 pg_catalog.upper(pg_catalog.translate(arm.fold_name(s.c),
                     'абвгдежзийклмнопрстуфхцчшщъыьэюяѐёђѓєѕіїјљњћќѝўџґàáâãäåæçèéêëìíîïðñòóôõöøùúûüýþαβγδεζηθικλμνξοπρστυφχψω',
                     'АБВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯЀЁЂЃЄЅІЇЈЉЊЋЌЍЎЏҐÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖØÙÚÛÜÝÞΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ')
                     COLLATE "C") AS up
          FROM pg_catalog.regexp_split_to_table(p_q, '') WITH ORDINALITY AS s(c, i)) x
$_$;


ALTER FUNCTION arm.name_pattern(p_q text) OWNER TO arm_owner;

--
-- Name: nats_message_bytes(text, text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.nats_message_bytes(p_payload text, p_msg_id text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT octet_length(p_payload)
           + octet_length(E'NATS/1.0\r\nNats-Msg-Id: ' || p_msg_id || E'\r\n\r\n')
$$;


ALTER FUNCTION arm.nats_message_bytes(p_payload text, p_msg_id text) OWNER TO arm_owner;

--
-- Name: outbox_ready_age(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.outbox_ready_age() RETURNS double precision
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
DECLARE
    p record;
    v_limit integer;
    v_in_flight integer;
    v_ready arm.pipeline[] := '{}';
    v_held boolean := false;
    v_oldest timestamptz;
BEGIN
    FOR p IN SELECT * FROM arm.pipeline_pace LOOP
        IF p.mode = 'off' THEN
            v_ready := v_ready || p.pipeline;
            CONTINUE;
        END IF;
        IF p.mode = 'auto' AND p.pinned_limit IS NULL AND NOT p.answering THEN
            v_held := true;
            CONTINUE;
        END IF;
        v_limit := CASE WHEN p.pinned_limit IS NOT NULL THEN p.pinned_limit
                        WHEN p.mode = 'fixed' THEN p.max_in_flight
                        ELSE floor(p.adaptive_limit)::integer END;
        SELECT count(*)::integer INTO v_in_flight
        FROM (SELECT 1 FROM arm.recognition_job j
              WHERE j.pipeline = p.pipeline AND j.status IN ('published', 'processing')
              LIMIT v_limit) AS f;
        IF v_in_flight < v_limit THEN
            v_ready := v_ready || p.pipeline;
        ELSE
            v_held := true;
        END IF;
    END LOOP;
    IF NOT v_held THEN
        SELECT min(j.requested_at) INTO v_oldest
        FROM arm.recognition_job j WHERE j.status = 'queued';
    ELSIF cardinality(v_ready) > 0 THEN
        SELECT min(first.requested_at) INTO v_oldest
        FROM arm.pace_lane l
        CROSS JOIN LATERAL (
            SELECT j.requested_at FROM arm.recognition_job j
            WHERE j.status = 'queued' AND j.pipeline = l.pipeline AND j.lane = l.lane
            ORDER BY j.requested_at LIMIT 1
        ) AS first
        WHERE l.pipeline = ANY (v_ready);
    END IF;
    RETURN coalesce(extract(epoch FROM clock_timestamp() - v_oldest), 0)::float8;
END;
$$;


ALTER FUNCTION arm.outbox_ready_age() OWNER TO arm_owner;

--
-- Name: pace_unheard(arm.pipeline, double precision); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.pace_unheard(p_pipeline arm.pipeline, p_retry_seconds double precision) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
BEGIN
    UPDATE arm.pipeline_pace
    SET answering = false,
        silent_since = coalesce(silent_since, clock_timestamp()),
        probe_after = clock_timestamp() + make_interval(secs => p_retry_seconds)
    WHERE pipeline = p_pipeline;
END;
$$;


ALTER FUNCTION arm.pace_unheard(p_pipeline arm.pipeline, p_retry_seconds double precision) OWNER TO arm_owner;

--
-- Name: pace_view(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.pace_view() RETURNS TABLE(pipeline arm.pipeline, mode text, in_flight_limit integer, pinned boolean, in_flight bigint, queued bigint, held_back bigint, answering boolean, silent_since timestamp with time zone, latency_seconds double precision, min_latency_seconds double precision, answers_per_second double precision)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH n AS (
        SELECT p.pipeline,
               (SELECT count(*) FROM arm.recognition_job j
                WHERE j.pipeline = p.pipeline
                  AND j.status IN ('published', 'processing')) AS in_flight,
               (SELECT count(*) FROM arm.recognition_job j
                WHERE j.pipeline = p.pipeline AND j.status = 'queued') AS queued,
               CASE WHEN p.pinned_limit IS NOT NULL THEN p.pinned_limit
                    WHEN p.mode = 'fixed' THEN p.max_in_flight
                    WHEN p.mode = 'auto' THEN floor(p.adaptive_limit)::integer END AS lim
        FROM arm.pipeline_pace p
    )
    SELECT p.pipeline, p.mode, n.lim, p.pinned_limit IS NOT NULL, n.in_flight, n.queued,
           CASE WHEN n.lim IS NULL THEN 0
                WHEN NOT p.answering AND p.mode = 'auto' AND p.pinned_limit IS NULL
                    THEN n.queued
                ELSE greatest(0, n.queued - greatest(0, n.lim - n.in_flight)) END,
           p.answering, p.silent_since, p.latency_seconds, p.min_latency_seconds,
           p.answers_per_second
    FROM arm.pipeline_pace p JOIN n ON n.pipeline = p.pipeline
    ORDER BY p.pipeline;
END;
$$;


ALTER FUNCTION arm.pace_view() OWNER TO arm_owner;

--
-- Name: pin_in_flight_limit(arm.pipeline, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.pin_in_flight_limit(p_pipeline arm.pipeline, p_limit integer) RETURNS TABLE(pipeline arm.pipeline, pinned_limit integer, adaptive_limit double precision)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
    IF p_limit IS NOT NULL AND p_limit < 1 THEN
        RAISE EXCEPTION 'an in-flight limit is at least 1, not %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE arm.pipeline_pace p SET pinned_limit = p_limit WHERE p.pipeline = p_pipeline
    RETURNING p.pipeline, p.pinned_limit, p.adaptive_limit;
END;
$$;


ALTER FUNCTION arm.pin_in_flight_limit(p_pipeline arm.pipeline, p_limit integer) OWNER TO arm_owner;

--
-- Name: pipeline_for(arm.file_type); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.pipeline_for(p_file_type arm.file_type) RETURNS arm.pipeline
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN p_file_type IN ('XLS', 'XLSX', 'XLSB')
                THEN 'tabular'::arm.pipeline
                ELSE 'image'::arm.pipeline END
$$;


ALTER FUNCTION arm.pipeline_for(p_file_type arm.file_type) OWNER TO arm_owner;

--
-- Name: publish_queued_jobs_v2(integer, interval, interval, text, text, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.publish_queued_jobs_v2(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer) RETURNS TABLE(job_id uuid, attempt integer, file_id uuid, outcome text, subject text, msg_id text, request text, error_message text, queued_seconds double precision)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
BEGIN
    -- Counted per statement (db/functions/80_status.sql), to the end of the transaction.
    PERFORM pg_catalog.set_config('arm.counting', 'statement', true);
    -- Two steps, like claim_unacked_jobs: 1. lock the batch, oldest first, through
    -- recognition_job_queued_idx; 2. build, size and mark it by primary key (id = ANY of
    -- the batch). In one statement the planner could not know the batch was small and,
    -- at some table sizes, hashed all of recognition_job and stored_file (final jobs
    -- included) to join a few hundred rows; and the one statement was planned again on
    -- every call (its generic plan was that hash), about 2 ms a batch. These two plan
    -- once and read only the batch.
    SELECT array_agg(q.id ORDER BY q.requested_at, q.id)
    INTO v_ids
    FROM (
        SELECT j.id, j.requested_at
        FROM arm.recognition_job j
        WHERE j.status = 'queued'
        ORDER BY j.requested_at, j.id
        LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED
    ) q;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY SELECT * FROM arm._publish_claimed(
        v_ids, p_tabular_reply_timeout, p_image_reply_timeout, p_tabular_subject,
        p_image_subject, p_max_bytes);
END;
$$;


ALTER FUNCTION arm.publish_queued_jobs_v2(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer) OWNER TO arm_owner;

--
-- Name: publish_queued_jobs_v3(integer, interval, interval, text, text, integer, text, integer, integer, integer, integer, interval, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.publish_queued_jobs_v3(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer, p_pacing text, p_tabular_min integer, p_tabular_max integer, p_image_min integer, p_image_max integer, p_ack_timeout interval, p_max_republish integer) RETURNS TABLE(job_id uuid, attempt integer, file_id uuid, outcome text, subject text, msg_id text, request text, error_message text, queued_seconds double precision, probe boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[] := '{}';
    v_probes uuid[] := '{}';
    v_got uuid[];
    v_room record;
BEGIN
    IF p_pacing NOT IN ('auto', 'fixed', 'off') THEN
        RAISE EXCEPTION 'pacing is auto, fixed or off, not %', p_pacing
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_pacing = 'off' THEN
        -- Said where the status reads it (no write when it says so already).
        UPDATE arm.pipeline_pace SET mode = 'off' WHERE mode <> 'off';
        RETURN QUERY SELECT v.*, false FROM arm.publish_queued_jobs_v2(
            p_limit, p_tabular_reply_timeout, p_image_reply_timeout, p_tabular_subject,
            p_image_subject, p_max_bytes) v;
        RETURN;
    END IF;
    IF least(p_tabular_min, p_image_min) < 1 OR p_tabular_max < p_tabular_min
       OR p_image_max < p_image_min THEN
        RAISE EXCEPTION 'in-flight limits: each minimum at least 1 and at most its maximum '
                        '(tabular %..%, image %..%)',
            p_tabular_min, p_tabular_max, p_image_min, p_image_max
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_room := arm._pace_room('tabular', p_pacing, p_tabular_min, p_tabular_max,
                             p_tabular_reply_timeout, p_ack_timeout, p_max_republish);
    IF v_room.room > 0 THEN
        v_got := arm._claim_fair('tabular', least(v_room.room, p_limit));
        v_ids := v_ids || v_got;
        IF v_room.probe THEN
            v_probes := v_probes || v_got;
        END IF;
    END IF;
    v_room := arm._pace_room('image', p_pacing, p_image_min, p_image_max,
                             p_image_reply_timeout, p_ack_timeout, p_max_republish);
    IF v_room.room > 0 THEN
        v_got := arm._claim_fair('image', least(v_room.room, p_limit));
        v_ids := v_ids || v_got;
        IF v_room.probe THEN
            v_probes := v_probes || v_got;
        END IF;
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT c.*, c.job_id = ANY (v_probes) FROM arm._publish_claimed(
        v_ids, p_tabular_reply_timeout, p_image_reply_timeout, p_tabular_subject,
        p_image_subject, p_max_bytes) c;
END;
$$;


ALTER FUNCTION arm.publish_queued_jobs_v3(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer, p_pacing text, p_tabular_min integer, p_tabular_max integer, p_image_min integer, p_image_max integer, p_ack_timeout interval, p_max_republish integer) OWNER TO arm_owner;

--
-- Name: record_bridge(text, text, timestamp with time zone, text, text, jsonb, integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.record_bridge(p_name text, p_version text, p_started_at timestamp with time zone, p_nats text, p_listener text, p_loops jsonb, p_held integer) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO arm.bridge_instance AS b
        (name, version, started_at, seen_at, nats, listener, loops, held)
    VALUES (p_name, p_version, p_started_at, clock_timestamp(), p_nats, p_listener,
            coalesce(p_loops, '{}'), p_held)
    ON CONFLICT (name) DO UPDATE
    SET version = EXCLUDED.version,
        started_at = EXCLUDED.started_at,
        seen_at = EXCLUDED.seen_at,
        nats = EXCLUDED.nats,
        listener = EXCLUDED.listener,
        loops = EXCLUDED.loops,
        held = EXCLUDED.held;
    DELETE FROM arm.bridge_instance WHERE seen_at < clock_timestamp() - interval '1 day';
END
$$;


ALTER FUNCTION arm.record_bridge(p_name text, p_version text, p_started_at timestamp with time zone, p_nats text, p_listener text, p_loops jsonb, p_held integer) OWNER TO arm_owner;

--
-- Name: record_waits(text, bigint[]); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.record_waits(p_phase text, p_counts bigint[]) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
BEGIN
    IF p_phase IS NULL OR p_phase NOT IN ('queued', 'ack', 'processing') THEN
        RAISE EXCEPTION 'record_waits: unknown phase %', p_phase
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(cardinality(p_counts), 0) <> cardinality(arm.wait_bucket_bounds()) + 1
       OR EXISTS (SELECT 1 FROM unnest(p_counts) c WHERE c IS NULL OR c < 0) THEN
        RAISE EXCEPTION 'record_waits: % counts expected, none negative',
            cardinality(arm.wait_bucket_bounds()) + 1
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT sum(c) FROM unnest(p_counts) c) > 0 THEN
        INSERT INTO arm.wait_sample (recorded_at, phase, counts)
        VALUES (clock_timestamp(), p_phase, p_counts);
    END IF;
END;
$$;


ALTER FUNCTION arm.record_waits(p_phase text, p_counts bigint[]) OWNER TO arm_owner;

--
-- Name: retry_file(uuid, text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.retry_file(p_file_id uuid, p_actor text) RETURNS TABLE(file_id uuid, outcome text, reason text, job_id uuid, attempt integer, previous_job_id uuid, previous_status arm.job_status, previous_attempt integer, max_attempts integer)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
    SELECT * FROM arm.retry_file_v3(p_file_id, p_actor, NULL, NULL)
$$;


ALTER FUNCTION arm.retry_file(p_file_id uuid, p_actor text) OWNER TO arm_owner;

--
-- Name: retry_file_v2(uuid, text, uuid); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.retry_file_v2(p_file_id uuid, p_actor text, p_expected_job_id uuid) RETURNS TABLE(file_id uuid, outcome text, reason text, job_id uuid, attempt integer, previous_job_id uuid, previous_status arm.job_status, previous_attempt integer, max_attempts integer)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
    SELECT * FROM arm.retry_file_v3(p_file_id, p_actor, p_expected_job_id, NULL)
$$;


ALTER FUNCTION arm.retry_file_v2(p_file_id uuid, p_actor text, p_expected_job_id uuid) OWNER TO arm_owner;

--
-- Name: retry_file_v3(uuid, text, uuid, text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.retry_file_v3(p_file_id uuid, p_actor text, p_expected_job_id uuid, p_actor_level text) RETURNS TABLE(file_id uuid, outcome text, reason text, job_id uuid, attempt integer, previous_job_id uuid, previous_status arm.job_status, previous_attempt integer, max_attempts integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    f arm.stored_file;
    j arm.recognition_job;
    v_new_id uuid;
BEGIN
    IF p_actor IS NULL OR btrim(p_actor) = '' THEN
        RAISE EXCEPTION 'retry_file needs an actor (who retries)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_actor_level NOT IN ('operator', 'all') THEN
        RAISE EXCEPTION 'retry_file: p_actor_level must be operator, all or NULL (the level the actor retried with), not %',
            quote_literal(p_actor_level)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT * INTO f FROM arm.stored_file WHERE id = p_file_id FOR UPDATE;
    IF NOT FOUND THEN
        -- Moved to the archive (arm.archive_files), perhaps while this call waited for the
        -- file's lock: its history is kept, read-only; a new upload is a new file.
        RETURN QUERY SELECT p_file_id, 'not_retryable', 'archived',
            NULL::uuid, NULL::integer, aj.id, aj.status, aj.attempt, aj.max_attempts
        FROM arm.archived_file af
        LEFT JOIN arm.archived_job aj ON aj.id = af.current_recognition_job_id
        WHERE af.id = p_file_id;
        IF FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY SELECT p_file_id, 'not_found', 'file_not_found',
            NULL::uuid, NULL::integer, NULL::uuid, NULL::arm.job_status, NULL::integer,
            NULL::integer;
        RETURN;
    END IF;

    SELECT * INTO j FROM arm.recognition_job WHERE id = f.current_recognition_job_id;
    IF p_expected_job_id IS NOT NULL
       AND p_expected_job_id IS DISTINCT FROM f.current_recognition_job_id THEN
        RETURN QUERY SELECT f.id, 'not_retryable', 'attempt_changed',
            NULL::uuid, NULL::integer, j.id, j.status, j.attempt, j.max_attempts;
        RETURN;
    END IF;
    IF NOT FOUND THEN
        RETURN QUERY SELECT f.id, 'not_retryable', 'no_job',
            NULL::uuid, NULL::integer, NULL::uuid, NULL::arm.job_status, NULL::integer,
            NULL::integer;
        RETURN;
    END IF;
    IF j.status NOT IN ('timeout', 'dlq', 'error') THEN
        RETURN QUERY SELECT f.id, 'not_retryable', 'not_failed',
            NULL::uuid, NULL::integer, j.id, j.status, j.attempt, j.max_attempts;
        RETURN;
    END IF;
    IF j.attempt >= j.max_attempts THEN
        RETURN QUERY SELECT f.id, 'not_retryable', 'attempts_exhausted',
            NULL::uuid, NULL::integer, j.id, j.status, j.attempt, j.max_attempts;
        RETURN;
    END IF;

    -- In the file's lane: a retry counts as its consolidation's (22_pacing.sql).
    INSERT INTO arm.recognition_job (file_id, pipeline, attempt, max_attempts, status, requested_at,
                                     lane)
    VALUES (f.id, j.pipeline, j.attempt + 1, j.max_attempts, 'queued', clock_timestamp(),
            coalesce(f.consolidation_id, '00000000-0000-0000-0000-000000000000'))
    RETURNING id INTO v_new_id;

    UPDATE arm.stored_file
    SET current_recognition_job_id = v_new_id,
        status = 'UPLOADED'
    WHERE id = f.id;

    INSERT INTO arm.retry_audit
        (file_id, old_job_id, new_job_id, new_attempt, actor, actor_level)
    VALUES (f.id, j.id, v_new_id, j.attempt + 1, p_actor, p_actor_level);

    RETURN QUERY SELECT f.id, 'retried', NULL::text,
        v_new_id, j.attempt + 1, j.id, j.status, j.attempt, j.max_attempts;
END;
$$;


ALTER FUNCTION arm.retry_file_v3(p_file_id uuid, p_actor text, p_expected_job_id uuid, p_actor_level text) OWNER TO arm_owner;

--
-- Name: retry_files(uuid[], text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.retry_files(p_file_ids uuid[], p_actor text) RETURNS TABLE(file_id uuid, outcome text, reason text, job_id uuid, attempt integer, previous_job_id uuid, previous_status arm.job_status, previous_attempt integer, max_attempts integer)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
    SELECT * FROM arm.retry_files_v3(p_file_ids, p_actor, NULL, NULL)
$$;


ALTER FUNCTION arm.retry_files(p_file_ids uuid[], p_actor text) OWNER TO arm_owner;

--
-- Name: retry_files_v2(uuid[], text, uuid[]); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.retry_files_v2(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[]) RETURNS TABLE(file_id uuid, outcome text, reason text, job_id uuid, attempt integer, previous_job_id uuid, previous_status arm.job_status, previous_attempt integer, max_attempts integer)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
    SELECT * FROM arm.retry_files_v3(p_file_ids, p_actor, p_expected_job_ids, NULL)
$$;


ALTER FUNCTION arm.retry_files_v2(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[]) OWNER TO arm_owner;

--
-- Name: retry_files_v3(uuid[], text, uuid[], text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.retry_files_v3(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[], p_actor_level text) RETURNS TABLE(file_id uuid, outcome text, reason text, job_id uuid, attempt integer, previous_job_id uuid, previous_status arm.job_status, previous_attempt integer, max_attempts integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_id uuid;
    v_expected uuid;
BEGIN
    FOR v_id, v_expected IN
        SELECT DISTINCT ON (u.id) u.id, u.expected
        FROM unnest(p_file_ids, coalesce(p_expected_job_ids, '{}'::uuid[]))
             WITH ORDINALITY AS u(id, expected, n)
        WHERE u.id IS NOT NULL
        ORDER BY u.id, u.n
    LOOP
        RETURN QUERY SELECT * FROM arm.retry_file_v3(v_id, p_actor, v_expected, p_actor_level);
    END LOOP;
END;
$$;


ALTER FUNCTION arm.retry_files_v3(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[], p_actor_level text) OWNER TO arm_owner;

--
-- Name: run_due_tasks(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.run_due_tasks() RETURNS TABLE(task text, result text, error text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.run_due_tasks() OWNER TO arm_owner;

--
-- Name: sample_status(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.sample_status() RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
DECLARE
    v_jobs jsonb;
    v_age double precision;
    v_waits jsonb;
BEGIN
    SELECT jsonb_object_agg(c.status, c.n) INTO v_jobs FROM arm.job_counts() c;
    SELECT coalesce(extract(epoch FROM clock_timestamp() - min(j.requested_at)), 0)::float8
    INTO v_age
    FROM arm.recognition_job j WHERE j.status = 'queued';
    WITH taken AS (
        DELETE FROM arm.wait_sample w RETURNING w.recorded_at, w.phase, w.counts
    ), summed AS (
        SELECT t.phase, u.i, sum(u.c)::bigint AS total
        FROM taken t, unnest(t.counts) WITH ORDINALITY AS u(c, i)
        WHERE t.recorded_at > clock_timestamp() - interval '10 minutes'
        GROUP BY t.phase, u.i
    )
    SELECT jsonb_object_agg(p.phase, p.counts) INTO v_waits
    FROM (SELECT m.phase, to_jsonb(array_agg(m.total ORDER BY m.i)) AS counts
          FROM summed m GROUP BY m.phase) p;
    INSERT INTO arm.status_sample (sampled_at, jobs, oldest_queued_age_seconds,
                                   queued_waits, ack_waits, processing_waits)
    VALUES (clock_timestamp(), v_jobs, v_age,
            ARRAY(SELECT jsonb_array_elements_text(v_waits -> 'queued')::bigint),
            ARRAY(SELECT jsonb_array_elements_text(v_waits -> 'ack')::bigint),
            ARRAY(SELECT jsonb_array_elements_text(v_waits -> 'processing')::bigint))
    ON CONFLICT (sampled_at) DO NOTHING;
    DELETE FROM arm.status_sample s WHERE s.sampled_at < clock_timestamp() - interval '1 day';
    RETURN format('queued %s, oldest %s s', coalesce(v_jobs ->> 'queued', '0'), round(v_age::numeric, 1));
END;
$$;


ALTER FUNCTION arm.sample_status() OWNER TO arm_owner;

--
-- Name: schedule_with_pg_cron(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.schedule_with_pg_cron() RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $_$
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
$_$;


ALTER FUNCTION arm.schedule_with_pg_cron() OWNER TO arm_owner;

--
-- Name: set_periodic_task(text, regprocedure, interval, boolean); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.set_periodic_task(p_name text, p_function regprocedure, p_run_every interval, p_enabled boolean DEFAULT true) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.set_periodic_task(p_name text, p_function regprocedure, p_run_every interval, p_enabled boolean) OWNER TO arm_owner;

--
-- Name: set_setting(text, text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.set_setting(p_name text, p_value text) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
    INSERT INTO arm.setting (name, value) VALUES (p_name, p_value)
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
$$;


ALTER FUNCTION arm.set_setting(p_name text, p_value text) OWNER TO arm_owner;

--
-- Name: set_sweep_interval(interval); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.set_sweep_interval(p_run_every interval) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
    INSERT INTO arm.periodic_task (name, function_name, run_every)
    VALUES ('sweep_timeouts', 'arm.sweep_timeouts()', p_run_every)
    ON CONFLICT (name) DO UPDATE
    SET run_every = EXCLUDED.run_every,
        next_run_at = least(arm.periodic_task.next_run_at, clock_timestamp() + EXCLUDED.run_every)
$$;


ALTER FUNCTION arm.set_sweep_interval(p_run_every interval) OWNER TO arm_owner;

--
-- Name: setting_int(text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.setting_int(p_name text) RETURNS integer
    LANGUAGE plpgsql STABLE
    AS $_$
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
$_$;


ALTER FUNCTION arm.setting_int(p_name text) OWNER TO arm_owner;

--
-- Name: status_series(integer); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.status_series(p_minutes integer DEFAULT 60) RETURNS TABLE(sampled_at timestamp with time zone, seconds double precision, finished jsonb, queued bigint, oldest_queued_age_seconds double precision, waits jsonb)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
    IF p_minutes IS NULL OR p_minutes < 1 OR p_minutes > 1440 THEN
        RAISE EXCEPTION 'status_series: minutes must be 1 to 1440, not %', p_minutes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH s AS (
        SELECT x.*,
               lag(x.sampled_at) OVER w AS prev_at, lag(x.jobs) OVER w AS prev_jobs
        FROM arm.status_sample x
        WHERE x.sampled_at > clock_timestamp() - make_interval(mins => p_minutes + 10)
        WINDOW w AS (ORDER BY x.sampled_at)
    )
    SELECT s.sampled_at,
           extract(epoch FROM s.sampled_at - s.prev_at)::float8,
           CASE WHEN s.prev_at IS NOT NULL THEN
               (SELECT jsonb_object_agg(f, greatest(0, coalesce((s.jobs ->> f)::bigint, 0)
                                                      - coalesce((s.prev_jobs ->> f)::bigint, 0)))
                FROM unnest(ARRAY['done', 'needs_check', 'error', 'timeout', 'dlq']) AS f)
           END,
           coalesce((s.jobs ->> 'queued')::bigint, 0),
           s.oldest_queued_age_seconds,
           CASE WHEN s.prev_at IS NOT NULL THEN
               jsonb_strip_nulls(jsonb_build_object(
                   'queued', arm.wait_summary(s.queued_waits),
                   'ack', arm.wait_summary(s.ack_waits),
                   'processing', arm.wait_summary(s.processing_waits)))
           END
    FROM s
    WHERE s.sampled_at > clock_timestamp() - make_interval(mins => p_minutes)
    ORDER BY s.sampled_at;
END;
$$;


ALTER FUNCTION arm.status_series(p_minutes integer) OWNER TO arm_owner;

--
-- Name: status_view(interval); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.status_view(p_ack_timeout interval) RETURNS TABLE(jobs jsonb, files jsonb, oldest_queued_age_seconds double precision, unacked_overdue bigint, past_deadline_unswept bigint, last_sweep_at timestamp with time zone, last_sweep_result text, last_sweep_error text)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.status_view(p_ack_timeout interval) OWNER TO arm_owner;

--
-- Name: sweep_timeouts(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.sweep_timeouts() RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.sweep_timeouts() OWNER TO arm_owner;

--
-- Name: tg_count_status_row(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.tg_count_status_row() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.tg_count_status_row() OWNER TO arm_owner;

--
-- Name: tg_count_statuses(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.tg_count_statuses() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.tg_count_statuses() OWNER TO arm_owner;

--
-- Name: tg_recognition_job__defaults(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.tg_recognition_job__defaults() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.tg_recognition_job__defaults() OWNER TO arm_owner;

--
-- Name: tg_recognition_job__guard(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.tg_recognition_job__guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.tg_recognition_job__guard() OWNER TO arm_owner;

--
-- Name: tg_recognition_job__inserted(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.tg_recognition_job__inserted() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.tg_recognition_job__inserted() OWNER TO arm_owner;

--
-- Name: tg_stored_file__source_role(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.tg_stored_file__source_role() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.tg_stored_file__source_role() OWNER TO arm_owner;

--
-- Name: tg_stored_file__touch(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.tg_stored_file__touch() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $$
BEGIN
    IF NEW IS DISTINCT FROM OLD THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END;
$$;


ALTER FUNCTION arm.tg_stored_file__touch() OWNER TO arm_owner;

--
-- Name: unschedule_pg_cron(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.unschedule_pg_cron() RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $_$
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
$_$;


ALTER FUNCTION arm.unschedule_pg_cron() OWNER TO arm_owner;

--
-- Name: upload_file(text, text, text, text, uuid, text, text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.upload_file(p_bucket text, p_key text, p_original_name text, p_file_type text, p_consolidation_id uuid DEFAULT NULL::uuid, p_created_by text DEFAULT NULL::text, p_bucket_role text DEFAULT 'uploads'::text) RETURNS TABLE(file_id uuid, job_id uuid)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
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


ALTER FUNCTION arm.upload_file(p_bucket text, p_key text, p_original_name text, p_file_type text, p_consolidation_id uuid, p_created_by text, p_bucket_role text) OWNER TO arm_owner;

--
-- Name: upload_files(jsonb); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.upload_files(p_files jsonb) RETURNS TABLE(n integer, file_id uuid, job_id uuid)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'arm', 'pg_temp'
    AS $_$
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
$_$;


ALTER FUNCTION arm.upload_files(p_files jsonb) OWNER TO arm_owner;

--
-- Name: upload_problem(text, text, text, text, text); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.upload_problem(p_bucket text, p_key text, p_original_name text, p_file_type text, p_bucket_role text) RETURNS text[]
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


ALTER FUNCTION arm.upload_problem(p_bucket text, p_key text, p_original_name text, p_file_type text, p_bucket_role text) OWNER TO arm_owner;

--
-- Name: wait_bucket_bounds(); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.wait_bucket_bounds() RETURNS double precision[]
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT '{0.01,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,120,300,600,1800,3600}'::double precision[]
$$;


ALTER FUNCTION arm.wait_bucket_bounds() OWNER TO arm_owner;

--
-- Name: wait_quantile(double precision, bigint[]); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.wait_quantile(q double precision, counts bigint[]) RETURNS double precision
    LANGUAGE plpgsql IMMUTABLE
    AS $$
DECLARE
    v_bounds double precision[] := arm.wait_bucket_bounds();
    v_last integer := cardinality(v_bounds);
    v_total numeric := 0;
    v_rank numeric;
    v_before numeric := 0;
    v_lower double precision := 0;
    v_n bigint;
    i integer := 0;
BEGIN
    -- Plain loops, no query: it runs twice per phase and point of a series.
    FOREACH v_n IN ARRAY counts LOOP
        v_total := v_total + v_n;
    END LOOP;
    IF v_total = 0 THEN
        RETURN NULL;
    END IF;
    v_rank := q * v_total;
    FOREACH v_n IN ARRAY counts LOOP
        i := i + 1;
        IF v_n > 0 AND v_before + v_n >= v_rank THEN
            IF i > v_last THEN
                RETURN v_bounds[v_last];
            END IF;
            RETURN v_lower + (v_bounds[i] - v_lower) * ((v_rank - v_before) / v_n)::double precision;
        END IF;
        v_before := v_before + v_n;
        IF i <= v_last THEN
            v_lower := v_bounds[i];
        END IF;
    END LOOP;
    RETURN v_bounds[v_last];
END;
$$;


ALTER FUNCTION arm.wait_quantile(q double precision, counts bigint[]) OWNER TO arm_owner;

--
-- Name: wait_summary(bigint[]); Type: FUNCTION; Schema: arm; Owner: arm_owner
--

CREATE FUNCTION arm.wait_summary(counts bigint[]) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN n > 0 THEN jsonb_build_object(
               'n', n,
               'p50', round(arm.wait_quantile(0.5, counts)::numeric, 3),
               'p99', round(arm.wait_quantile(0.99, counts)::numeric, 3)) END
    FROM (SELECT sum(c)::bigint AS n FROM unnest(counts) AS c) t
$$;


ALTER FUNCTION arm.wait_summary(counts bigint[]) OWNER TO arm_owner;

--
-- Name: archived_file; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.archived_file (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    consolidation_id uuid,
    original_name text NOT NULL,
    file_type arm.file_type NOT NULL,
    s3_object_id uuid NOT NULL,
    status arm.file_status DEFAULT 'UPLOADED'::arm.file_status NOT NULL,
    current_recognition_job_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    archived_at timestamp with time zone DEFAULT now() NOT NULL
);


ALTER TABLE arm.archived_file OWNER TO arm_owner;

--
-- Name: archived_job; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.archived_job (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    file_id uuid NOT NULL,
    pipeline arm.pipeline NOT NULL,
    attempt integer DEFAULT 1 NOT NULL,
    max_attempts integer NOT NULL,
    status arm.job_status DEFAULT 'queued'::arm.job_status NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    request_msg_id text,
    request_subject text,
    reply_deadline timestamp with time zone,
    republish_count integer DEFAULT 0 NOT NULL,
    last_published_at timestamp with time zone,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    service_name text,
    service_version text,
    metrics jsonb,
    error_code text,
    error_message text,
    result_schema_version text,
    result_s3_object_id uuid,
    result_msg_id text,
    group_schema jsonb,
    lane uuid,
    CONSTRAINT recognition_job_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT recognition_job_attempt_limit CHECK ((attempt <= max_attempts)),
    CONSTRAINT recognition_job_error_code CHECK (((status = ANY (ARRAY['error'::arm.job_status, 'timeout'::arm.job_status, 'dlq'::arm.job_status])) = (error_code IS NOT NULL))),
    CONSTRAINT recognition_job_error_message CHECK (((error_message IS NULL) OR (error_code IS NOT NULL))),
    CONSTRAINT recognition_job_finished_at CHECK (((status = ANY (ARRAY['done'::arm.job_status, 'needs_check'::arm.job_status, 'error'::arm.job_status, 'timeout'::arm.job_status, 'dlq'::arm.job_status])) = (finished_at IS NOT NULL))),
    CONSTRAINT recognition_job_group_schema CHECK (((group_schema IS NULL) OR (status = ANY (ARRAY['done'::arm.job_status, 'needs_check'::arm.job_status])))),
    CONSTRAINT recognition_job_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT recognition_job_no_result_while_live CHECK (((status <> ALL (ARRAY['queued'::arm.job_status, 'published'::arm.job_status, 'processing'::arm.job_status])) OR ((result_s3_object_id IS NULL) AND (metrics IS NULL) AND (result_schema_version IS NULL)))),
    CONSTRAINT recognition_job_not_started_yet CHECK (((status <> ALL (ARRAY['queued'::arm.job_status, 'published'::arm.job_status])) OR (started_at IS NULL))),
    CONSTRAINT recognition_job_published_fields CHECK ((((published_at IS NULL) = (request_msg_id IS NULL)) AND ((published_at IS NULL) = (request_subject IS NULL)) AND ((published_at IS NULL) = (reply_deadline IS NULL)) AND ((published_at IS NULL) = (last_published_at IS NULL)) AND ((status <> 'queued'::arm.job_status) OR (published_at IS NULL)) AND ((status = ANY (ARRAY['queued'::arm.job_status, 'dlq'::arm.job_status])) OR (published_at IS NOT NULL)))),
    CONSTRAINT recognition_job_republish_count_check CHECK ((republish_count >= 0)),
    CONSTRAINT recognition_job_republish_only_when_published CHECK (((republish_count = 0) OR (published_at IS NOT NULL))),
    CONSTRAINT recognition_job_result_msg_id CHECK (((status = ANY (ARRAY['done'::arm.job_status, 'needs_check'::arm.job_status, 'error'::arm.job_status])) = (result_msg_id IS NOT NULL))),
    CONSTRAINT recognition_job_result_object CHECK (((status <> ALL (ARRAY['done'::arm.job_status, 'needs_check'::arm.job_status])) OR ((result_s3_object_id IS NOT NULL) AND (result_schema_version IS NOT NULL)))),
    CONSTRAINT recognition_job_started_fields CHECK (((status <> 'processing'::arm.job_status) OR ((started_at IS NOT NULL) AND (service_name IS NOT NULL))))
);


ALTER TABLE arm.archived_job OWNER TO arm_owner;

--
-- Name: archived_retry_audit; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.archived_retry_audit (
    id bigint NOT NULL,
    file_id uuid NOT NULL,
    old_job_id uuid NOT NULL,
    new_job_id uuid NOT NULL,
    new_attempt integer NOT NULL,
    actor text NOT NULL,
    retried_at timestamp with time zone DEFAULT now() NOT NULL,
    actor_level text
);


ALTER TABLE arm.archived_retry_audit OWNER TO arm_owner;

--
-- Name: bridge_instance; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.bridge_instance (
    name text NOT NULL,
    version text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    seen_at timestamp with time zone NOT NULL,
    nats text NOT NULL,
    listener text NOT NULL,
    loops jsonb DEFAULT '{}'::jsonb NOT NULL,
    held integer NOT NULL,
    CONSTRAINT bridge_instance_held_check CHECK ((held >= 0)),
    CONSTRAINT bridge_instance_listener_check CHECK ((length(listener) <= 40)),
    CONSTRAINT bridge_instance_loops_check CHECK ((jsonb_typeof(loops) = 'object'::text)),
    CONSTRAINT bridge_instance_name_check CHECK (((length(name) >= 1) AND (length(name) <= 200))),
    CONSTRAINT bridge_instance_nats_check CHECK ((length(nats) <= 40)),
    CONSTRAINT bridge_instance_version_check CHECK ((length(version) <= 100))
)
WITH (fillfactor='50');


ALTER TABLE arm.bridge_instance OWNER TO arm_owner;

--
-- Name: file_count; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.file_count (
    status arm.file_status NOT NULL,
    n bigint NOT NULL
);


ALTER TABLE arm.file_count OWNER TO arm_owner;

--
-- Name: file_count_delta; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.file_count_delta (
    status arm.file_status NOT NULL,
    n bigint NOT NULL
);


ALTER TABLE arm.file_count_delta OWNER TO arm_owner;

--
-- Name: job_count; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.job_count (
    status arm.job_status NOT NULL,
    n bigint NOT NULL
);


ALTER TABLE arm.job_count OWNER TO arm_owner;

--
-- Name: job_count_delta; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.job_count_delta (
    status arm.job_status NOT NULL,
    n bigint NOT NULL
);


ALTER TABLE arm.job_count_delta OWNER TO arm_owner;

--
-- Name: pace_lane; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.pace_lane (
    pipeline arm.pipeline NOT NULL,
    lane uuid NOT NULL,
    served_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL
);


ALTER TABLE arm.pace_lane OWNER TO arm_owner;

--
-- Name: pace_sample; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.pace_sample (
    id bigint NOT NULL,
    pipeline arm.pipeline NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    answers integer NOT NULL,
    answer_seconds double precision NOT NULL,
    acks integer NOT NULL,
    ack_seconds double precision NOT NULL
);


ALTER TABLE arm.pace_sample OWNER TO arm_owner;

--
-- Name: pace_sample_id_seq; Type: SEQUENCE; Schema: arm; Owner: arm_owner
--

ALTER TABLE arm.pace_sample ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME arm.pace_sample_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: periodic_task; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.periodic_task (
    name text NOT NULL,
    function_name regprocedure NOT NULL,
    run_every interval NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    next_run_at timestamp with time zone DEFAULT now() NOT NULL,
    last_started_at timestamp with time zone,
    last_finished_at timestamp with time zone,
    last_result text,
    last_error text,
    run_count bigint DEFAULT 0 NOT NULL,
    CONSTRAINT periodic_task_run_every_check CHECK ((run_every >= '00:00:01'::interval))
);


ALTER TABLE arm.periodic_task OWNER TO arm_owner;

--
-- Name: pipeline_pace; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.pipeline_pace (
    pipeline arm.pipeline NOT NULL,
    mode text DEFAULT 'off'::text NOT NULL,
    min_in_flight integer DEFAULT 1 NOT NULL,
    max_in_flight integer DEFAULT 1000 NOT NULL,
    adaptive_limit double precision DEFAULT 1 NOT NULL,
    pinned_limit integer,
    latency_seconds double precision,
    min_latency_seconds double precision,
    answers_per_second double precision,
    answering boolean DEFAULT true NOT NULL,
    silent_since timestamp with time zone,
    probe_after timestamp with time zone,
    adjusted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT pipeline_pace_adaptive_limit_check CHECK ((adaptive_limit >= (1)::double precision)),
    CONSTRAINT pipeline_pace_check CHECK ((max_in_flight >= min_in_flight)),
    CONSTRAINT pipeline_pace_min_in_flight_check CHECK ((min_in_flight >= 1)),
    CONSTRAINT pipeline_pace_mode_check CHECK ((mode = ANY (ARRAY['auto'::text, 'fixed'::text, 'off'::text]))),
    CONSTRAINT pipeline_pace_pinned_limit_check CHECK ((pinned_limit >= 1))
);


ALTER TABLE arm.pipeline_pace OWNER TO arm_owner;

--
-- Name: retry_audit; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.retry_audit (
    id bigint NOT NULL,
    file_id uuid NOT NULL,
    old_job_id uuid NOT NULL,
    new_job_id uuid NOT NULL,
    new_attempt integer NOT NULL,
    actor text NOT NULL,
    retried_at timestamp with time zone DEFAULT now() NOT NULL,
    actor_level text,
    CONSTRAINT retry_audit_actor_check CHECK ((actor <> ''::text))
);


ALTER TABLE arm.retry_audit OWNER TO arm_owner;

--
-- Name: retry_audit_id_seq; Type: SEQUENCE; Schema: arm; Owner: arm_owner
--

ALTER TABLE arm.retry_audit ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME arm.retry_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: setting; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.setting (
    name text NOT NULL,
    value text NOT NULL,
    description text DEFAULT ''::text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


ALTER TABLE arm.setting OWNER TO arm_owner;

--
-- Name: status_sample; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.status_sample (
    sampled_at timestamp with time zone NOT NULL,
    jobs jsonb NOT NULL,
    oldest_queued_age_seconds double precision NOT NULL,
    queued_waits bigint[],
    ack_waits bigint[],
    processing_waits bigint[]
);


ALTER TABLE arm.status_sample OWNER TO arm_owner;

--
-- Name: wait_sample; Type: TABLE; Schema: arm; Owner: arm_owner
--

CREATE TABLE arm.wait_sample (
    recorded_at timestamp with time zone NOT NULL,
    phase text NOT NULL,
    counts bigint[] NOT NULL,
    CONSTRAINT wait_sample_counts_check CHECK ((cardinality(counts) >= 1)),
    CONSTRAINT wait_sample_phase_check CHECK ((phase = ANY (ARRAY['queued'::text, 'ack'::text, 'processing'::text])))
);


ALTER TABLE arm.wait_sample OWNER TO arm_owner;

--
-- Name: archived_file archived_file_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.archived_file
    ADD CONSTRAINT archived_file_pkey PRIMARY KEY (id);


--
-- Name: archived_job archived_job_file_attempt_key; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.archived_job
    ADD CONSTRAINT archived_job_file_attempt_key UNIQUE (file_id, attempt);


--
-- Name: archived_job archived_job_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.archived_job
    ADD CONSTRAINT archived_job_pkey PRIMARY KEY (id);


--
-- Name: archived_retry_audit archived_retry_audit_actor_level; Type: CHECK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE arm.archived_retry_audit
    ADD CONSTRAINT archived_retry_audit_actor_level CHECK ((actor_level = ANY (ARRAY['operator'::text, 'all'::text]))) NOT VALID;


--
-- Name: archived_retry_audit archived_retry_audit_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.archived_retry_audit
    ADD CONSTRAINT archived_retry_audit_pkey PRIMARY KEY (id);


--
-- Name: bridge_instance bridge_instance_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.bridge_instance
    ADD CONSTRAINT bridge_instance_pkey PRIMARY KEY (name);


--
-- Name: file_count file_count_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.file_count
    ADD CONSTRAINT file_count_pkey PRIMARY KEY (status);


--
-- Name: job_count job_count_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.job_count
    ADD CONSTRAINT job_count_pkey PRIMARY KEY (status);


--
-- Name: pace_lane pace_lane_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.pace_lane
    ADD CONSTRAINT pace_lane_pkey PRIMARY KEY (pipeline, lane);


--
-- Name: pace_sample pace_sample_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.pace_sample
    ADD CONSTRAINT pace_sample_pkey PRIMARY KEY (id);


--
-- Name: periodic_task periodic_task_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.periodic_task
    ADD CONSTRAINT periodic_task_pkey PRIMARY KEY (name);


--
-- Name: pipeline_pace pipeline_pace_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.pipeline_pace
    ADD CONSTRAINT pipeline_pace_pkey PRIMARY KEY (pipeline);


--
-- Name: recognition_job recognition_job_file_attempt_key; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.recognition_job
    ADD CONSTRAINT recognition_job_file_attempt_key UNIQUE (file_id, attempt);


--
-- Name: recognition_job recognition_job_id_file_key; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.recognition_job
    ADD CONSTRAINT recognition_job_id_file_key UNIQUE (id, file_id);


--
-- Name: recognition_job recognition_job_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.recognition_job
    ADD CONSTRAINT recognition_job_pkey PRIMARY KEY (id);


--
-- Name: retry_audit retry_audit_actor_level; Type: CHECK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE arm.retry_audit
    ADD CONSTRAINT retry_audit_actor_level CHECK ((actor_level = ANY (ARRAY['operator'::text, 'all'::text]))) NOT VALID;


--
-- Name: retry_audit retry_audit_new_job_id_key; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.retry_audit
    ADD CONSTRAINT retry_audit_new_job_id_key UNIQUE (new_job_id);


--
-- Name: retry_audit retry_audit_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.retry_audit
    ADD CONSTRAINT retry_audit_pkey PRIMARY KEY (id);


--
-- Name: s3_object s3_object_bucket_length; Type: CHECK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE arm.s3_object
    ADD CONSTRAINT s3_object_bucket_length CHECK ((char_length(bucket) <= 63)) NOT VALID;


--
-- Name: s3_object s3_object_key_length; Type: CHECK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE arm.s3_object
    ADD CONSTRAINT s3_object_key_length CHECK ((char_length(key) <= 1024)) NOT VALID;


--
-- Name: s3_object s3_object_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.s3_object
    ADD CONSTRAINT s3_object_pkey PRIMARY KEY (id);


--
-- Name: setting setting_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.setting
    ADD CONSTRAINT setting_pkey PRIMARY KEY (name);


--
-- Name: status_sample status_sample_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.status_sample
    ADD CONSTRAINT status_sample_pkey PRIMARY KEY (sampled_at);


--
-- Name: stored_file stored_file_original_name_length; Type: CHECK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE arm.stored_file
    ADD CONSTRAINT stored_file_original_name_length CHECK ((char_length(original_name) <= 1024)) NOT VALID;


--
-- Name: stored_file stored_file_pkey; Type: CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.stored_file
    ADD CONSTRAINT stored_file_pkey PRIMARY KEY (id);


--
-- Name: archived_retry_audit_file_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX archived_retry_audit_file_idx ON arm.archived_retry_audit USING btree (file_id, retried_at);


--
-- Name: pace_lane_served_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX pace_lane_served_idx ON arm.pace_lane USING btree (pipeline, served_at, lane);


--
-- Name: pace_sample_pipeline_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX pace_sample_pipeline_idx ON arm.pace_sample USING btree (pipeline, id);


--
-- Name: recognition_job_in_flight_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX recognition_job_in_flight_idx ON arm.recognition_job USING btree (pipeline) INCLUDE (status, published_at, last_published_at) WHERE (status = ANY (ARRAY['published'::arm.job_status, 'processing'::arm.job_status]));


--
-- Name: recognition_job_live_deadline_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX recognition_job_live_deadline_idx ON arm.recognition_job USING btree (reply_deadline) WHERE (status = ANY (ARRAY['published'::arm.job_status, 'processing'::arm.job_status]));


--
-- Name: recognition_job_one_live_per_file_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE UNIQUE INDEX recognition_job_one_live_per_file_idx ON arm.recognition_job USING btree (file_id) WHERE (status = ANY (ARRAY['queued'::arm.job_status, 'published'::arm.job_status, 'processing'::arm.job_status]));


--
-- Name: recognition_job_queued_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX recognition_job_queued_idx ON arm.recognition_job USING btree (requested_at, id) WHERE (status = 'queued'::arm.job_status);


--
-- Name: recognition_job_queued_lane_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX recognition_job_queued_lane_idx ON arm.recognition_job USING btree (pipeline, lane, requested_at, id) WHERE (status = 'queued'::arm.job_status);


--
-- Name: recognition_job_result_s3_object_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX recognition_job_result_s3_object_idx ON arm.recognition_job USING btree (result_s3_object_id) WHERE (result_s3_object_id IS NOT NULL);


--
-- Name: recognition_job_unacked_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX recognition_job_unacked_idx ON arm.recognition_job USING btree (last_published_at, id) WHERE (status = 'published'::arm.job_status);


--
-- Name: retry_audit_file_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX retry_audit_file_idx ON arm.retry_audit USING btree (file_id, retried_at);


--
-- Name: s3_object_bucket_key_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX s3_object_bucket_key_idx ON arm.s3_object USING btree (bucket, key);


--
-- Name: stored_file_consolidation_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX stored_file_consolidation_idx ON arm.stored_file USING btree (consolidation_id);


--
-- Name: stored_file_created_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX stored_file_created_idx ON arm.stored_file USING btree (created_at DESC, id DESC);


--
-- Name: stored_file_failed_created_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX stored_file_failed_created_idx ON arm.stored_file USING btree (created_at DESC, id DESC) WHERE failed;


--
-- Name: stored_file_name_trgm_idx; Type: INDEX; Schema: arm; Owner: arm_owner
--

CREATE INDEX stored_file_name_trgm_idx ON arm.stored_file USING gin (arm.fold_name(original_name) public.gin_trgm_ops);


--
-- Name: recognition_job tg_recognition_job__count_delete; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_recognition_job__count_delete AFTER DELETE ON arm.recognition_job REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();


--
-- Name: recognition_job tg_recognition_job__count_insert; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_recognition_job__count_insert AFTER INSERT ON arm.recognition_job REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();


--
-- Name: recognition_job tg_recognition_job__count_truncate; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_recognition_job__count_truncate AFTER TRUNCATE ON arm.recognition_job FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();


--
-- Name: recognition_job tg_recognition_job__count_update; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_recognition_job__count_update AFTER UPDATE ON arm.recognition_job REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT WHEN ((current_setting('arm.counting'::text, true) = 'statement'::text)) EXECUTE FUNCTION arm.tg_count_statuses();


--
-- Name: recognition_job tg_recognition_job__count_update_row; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_recognition_job__count_update_row AFTER UPDATE ON arm.recognition_job FOR EACH ROW WHEN (((old.status IS DISTINCT FROM new.status) AND (current_setting('arm.counting'::text, true) IS DISTINCT FROM 'statement'::text))) EXECUTE FUNCTION arm.tg_count_status_row();


--
-- Name: recognition_job tg_recognition_job__defaults; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_recognition_job__defaults BEFORE INSERT ON arm.recognition_job FOR EACH ROW WHEN (((new.pipeline IS NULL) OR (new.max_attempts IS NULL) OR (new.lane IS NULL))) EXECUTE FUNCTION arm.tg_recognition_job__defaults();


--
-- Name: recognition_job tg_recognition_job__guard; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_recognition_job__guard BEFORE UPDATE ON arm.recognition_job FOR EACH ROW EXECUTE FUNCTION arm.tg_recognition_job__guard();


--
-- Name: recognition_job tg_recognition_job__inserted; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_recognition_job__inserted AFTER INSERT ON arm.recognition_job REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_recognition_job__inserted();


--
-- Name: stored_file tg_stored_file__count_delete; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_stored_file__count_delete AFTER DELETE ON arm.stored_file REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();


--
-- Name: stored_file tg_stored_file__count_insert; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_stored_file__count_insert AFTER INSERT ON arm.stored_file REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();


--
-- Name: stored_file tg_stored_file__count_truncate; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_stored_file__count_truncate AFTER TRUNCATE ON arm.stored_file FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_count_statuses();


--
-- Name: stored_file tg_stored_file__count_update; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_stored_file__count_update AFTER UPDATE ON arm.stored_file REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT WHEN ((current_setting('arm.counting'::text, true) = 'statement'::text)) EXECUTE FUNCTION arm.tg_count_statuses();


--
-- Name: stored_file tg_stored_file__count_update_row; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_stored_file__count_update_row AFTER UPDATE ON arm.stored_file FOR EACH ROW WHEN (((old.status IS DISTINCT FROM new.status) AND (current_setting('arm.counting'::text, true) IS DISTINCT FROM 'statement'::text))) EXECUTE FUNCTION arm.tg_count_status_row();


--
-- Name: stored_file tg_stored_file__source_role; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_stored_file__source_role BEFORE UPDATE OF s3_object_id ON arm.stored_file FOR EACH ROW EXECUTE FUNCTION arm.tg_stored_file__source_role();


--
-- Name: stored_file tg_stored_file__source_role_insert; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_stored_file__source_role_insert AFTER INSERT ON arm.stored_file REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION arm.tg_stored_file__source_role();


--
-- Name: stored_file tg_stored_file__touch; Type: TRIGGER; Schema: arm; Owner: arm_owner
--

CREATE TRIGGER tg_stored_file__touch BEFORE UPDATE ON arm.stored_file FOR EACH ROW EXECUTE FUNCTION arm.tg_stored_file__touch();


--
-- Name: recognition_job recognition_job_file_id_fkey; Type: FK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.recognition_job
    ADD CONSTRAINT recognition_job_file_id_fkey FOREIGN KEY (file_id) REFERENCES arm.stored_file(id);


--
-- Name: recognition_job recognition_job_result_s3_object_id_fkey; Type: FK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.recognition_job
    ADD CONSTRAINT recognition_job_result_s3_object_id_fkey FOREIGN KEY (result_s3_object_id) REFERENCES arm.s3_object(id);


--
-- Name: retry_audit retry_audit_file_id_fkey; Type: FK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.retry_audit
    ADD CONSTRAINT retry_audit_file_id_fkey FOREIGN KEY (file_id) REFERENCES arm.stored_file(id);


--
-- Name: retry_audit retry_audit_new_job_id_fkey; Type: FK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.retry_audit
    ADD CONSTRAINT retry_audit_new_job_id_fkey FOREIGN KEY (new_job_id) REFERENCES arm.recognition_job(id);


--
-- Name: retry_audit retry_audit_old_job_id_fkey; Type: FK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.retry_audit
    ADD CONSTRAINT retry_audit_old_job_id_fkey FOREIGN KEY (old_job_id) REFERENCES arm.recognition_job(id);


--
-- Name: stored_file stored_file_current_job_fkey; Type: FK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.stored_file
    ADD CONSTRAINT stored_file_current_job_fkey FOREIGN KEY (current_recognition_job_id, id) REFERENCES arm.recognition_job(id, file_id);


--
-- Name: stored_file stored_file_s3_object_id_fkey; Type: FK CONSTRAINT; Schema: arm; Owner: arm_owner
--

ALTER TABLE ONLY arm.stored_file
    ADD CONSTRAINT stored_file_s3_object_id_fkey FOREIGN KEY (s3_object_id) REFERENCES arm.s3_object(id);


--
-- Name: SCHEMA arm; Type: ACL; Schema: -; Owner: arm_owner
--

GRANT USAGE ON SCHEMA arm TO arm_bridge;
GRANT USAGE ON SCHEMA arm TO arm_api;
GRANT USAGE ON SCHEMA arm TO arm_uploader;
GRANT USAGE ON SCHEMA arm TO arm_readonly;


--
-- Name: FUNCTION _claim_fair(p_pipeline arm.pipeline, p_n integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm._claim_fair(p_pipeline arm.pipeline, p_n integer) FROM PUBLIC;


--
-- Name: FUNCTION _dead_letter_jobs(p_from arm.job_status, p_job_ids uuid[], p_error_codes text[], p_error_messages text[]); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm._dead_letter_jobs(p_from arm.job_status, p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) FROM PUBLIC;


--
-- Name: FUNCTION _pace_room(p_pipeline arm.pipeline, p_mode text, p_min integer, p_max integer, p_reply_timeout interval, p_ack_timeout interval, p_max_republish integer, OUT room integer, OUT probe boolean); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm._pace_room(p_pipeline arm.pipeline, p_mode text, p_min integer, p_max integer, p_reply_timeout interval, p_ack_timeout interval, p_max_republish integer, OUT room integer, OUT probe boolean) FROM PUBLIC;


--
-- Name: FUNCTION _publish_claimed(p_ids uuid[], p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm._publish_claimed(p_ids uuid[], p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer) FROM PUBLIC;


--
-- Name: FUNCTION _repair_lanes(p_pipeline arm.pipeline); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm._repair_lanes(p_pipeline arm.pipeline) FROM PUBLIC;


--
-- Name: TABLE recognition_job; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.recognition_job TO arm_readonly;


--
-- Name: COLUMN recognition_job.id; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT(id),INSERT(id) ON TABLE arm.recognition_job TO arm_uploader;


--
-- Name: COLUMN recognition_job.file_id; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(file_id) ON TABLE arm.recognition_job TO arm_uploader;


--
-- Name: COLUMN recognition_job.pipeline; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(pipeline) ON TABLE arm.recognition_job TO arm_uploader;


--
-- Name: COLUMN recognition_job.attempt; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(attempt) ON TABLE arm.recognition_job TO arm_uploader;


--
-- Name: COLUMN recognition_job.max_attempts; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(max_attempts) ON TABLE arm.recognition_job TO arm_uploader;


--
-- Name: COLUMN recognition_job.status; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT(status) ON TABLE arm.recognition_job TO arm_bridge;
GRANT SELECT(status) ON TABLE arm.recognition_job TO arm_api;


--
-- Name: COLUMN recognition_job.requested_at; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT(requested_at) ON TABLE arm.recognition_job TO arm_bridge;
GRANT SELECT(requested_at) ON TABLE arm.recognition_job TO arm_api;


--
-- Name: TABLE s3_object; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.s3_object TO arm_readonly;


--
-- Name: COLUMN s3_object.id; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT(id),INSERT(id) ON TABLE arm.s3_object TO arm_uploader;


--
-- Name: COLUMN s3_object.bucket; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(bucket) ON TABLE arm.s3_object TO arm_uploader;


--
-- Name: COLUMN s3_object.key; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(key) ON TABLE arm.s3_object TO arm_uploader;


--
-- Name: COLUMN s3_object.bucket_role; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(bucket_role) ON TABLE arm.s3_object TO arm_uploader;


--
-- Name: COLUMN s3_object.created_by; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(created_by) ON TABLE arm.s3_object TO arm_uploader;


--
-- Name: TABLE stored_file; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.stored_file TO arm_readonly;


--
-- Name: COLUMN stored_file.id; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT(id),INSERT(id) ON TABLE arm.stored_file TO arm_uploader;


--
-- Name: COLUMN stored_file.consolidation_id; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(consolidation_id) ON TABLE arm.stored_file TO arm_uploader;


--
-- Name: COLUMN stored_file.original_name; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(original_name) ON TABLE arm.stored_file TO arm_uploader;


--
-- Name: COLUMN stored_file.file_type; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(file_type) ON TABLE arm.stored_file TO arm_uploader;


--
-- Name: COLUMN stored_file.s3_object_id; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT INSERT(s3_object_id) ON TABLE arm.stored_file TO arm_uploader;


--
-- Name: COLUMN stored_file.current_recognition_job_id; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT UPDATE(current_recognition_job_id) ON TABLE arm.stored_file TO arm_uploader;


--
-- Name: FUNCTION apply_envelopes_v2(p_envelopes jsonb); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.apply_envelopes_v2(p_envelopes jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.apply_envelopes_v2(p_envelopes jsonb) TO arm_bridge;


--
-- Name: FUNCTION archive_files(p_finished_before timestamp with time zone, p_limit integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.archive_files(p_finished_before timestamp with time zone, p_limit integer) FROM PUBLIC;


--
-- Name: FUNCTION bridge_instances(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.bridge_instances() FROM PUBLIC;
GRANT ALL ON FUNCTION arm.bridge_instances() TO arm_api;
GRANT ALL ON FUNCTION arm.bridge_instances() TO arm_readonly;


--
-- Name: FUNCTION claim_unacked_jobs(p_limit integer, p_ack_timeout interval, p_max_republish integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.claim_unacked_jobs(p_limit integer, p_ack_timeout interval, p_max_republish integer) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.claim_unacked_jobs(p_limit integer, p_ack_timeout interval, p_max_republish integer) TO arm_bridge;


--
-- Name: FUNCTION compact_counts(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.compact_counts() FROM PUBLIC;
GRANT ALL ON FUNCTION arm.compact_counts() TO arm_bridge;


--
-- Name: FUNCTION dead_letter_unacked(p_ack_timeout interval, p_max_republish integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.dead_letter_unacked(p_ack_timeout interval, p_max_republish integer) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.dead_letter_unacked(p_ack_timeout interval, p_max_republish integer) TO arm_bridge;


--
-- Name: FUNCTION dead_letter_unpublishable(p_job_ids uuid[], p_error_codes text[], p_error_messages text[]); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.dead_letter_unpublishable(p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) FROM PUBLIC;


--
-- Name: FUNCTION dead_letter_unrepublishable(p_job_ids uuid[], p_error_codes text[], p_error_messages text[]); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.dead_letter_unrepublishable(p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.dead_letter_unrepublishable(p_job_ids uuid[], p_error_codes text[], p_error_messages text[]) TO arm_bridge;


--
-- Name: FUNCTION file_counts(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.file_counts() FROM PUBLIC;
GRANT ALL ON FUNCTION arm.file_counts() TO arm_readonly;


--
-- Name: FUNCTION forget_bridge(p_name text); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.forget_bridge(p_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.forget_bridge(p_name text) TO arm_bridge;


--
-- Name: FUNCTION get_file(p_file_id uuid); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.get_file(p_file_id uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.get_file(p_file_id uuid) TO arm_api;
GRANT ALL ON FUNCTION arm.get_file(p_file_id uuid) TO arm_readonly;


--
-- Name: FUNCTION job_counts(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.job_counts() FROM PUBLIC;
GRANT ALL ON FUNCTION arm.job_counts() TO arm_api;
GRANT ALL ON FUNCTION arm.job_counts() TO arm_readonly;


--
-- Name: FUNCTION list_files(p_limit integer, p_after_created_at timestamp with time zone, p_after_id uuid, p_statuses arm.file_status[], p_job_statuses arm.job_status[], p_consolidation_id uuid, p_file_types arm.file_type[], p_q text, p_updated_after timestamp with time zone, p_updated_before timestamp with time zone); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.list_files(p_limit integer, p_after_created_at timestamp with time zone, p_after_id uuid, p_statuses arm.file_status[], p_job_statuses arm.job_status[], p_consolidation_id uuid, p_file_types arm.file_type[], p_q text, p_updated_after timestamp with time zone, p_updated_before timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.list_files(p_limit integer, p_after_created_at timestamp with time zone, p_after_id uuid, p_statuses arm.file_status[], p_job_statuses arm.job_status[], p_consolidation_id uuid, p_file_types arm.file_type[], p_q text, p_updated_after timestamp with time zone, p_updated_before timestamp with time zone) TO arm_api;
GRANT ALL ON FUNCTION arm.list_files(p_limit integer, p_after_created_at timestamp with time zone, p_after_id uuid, p_statuses arm.file_status[], p_job_statuses arm.job_status[], p_consolidation_id uuid, p_file_types arm.file_type[], p_q text, p_updated_after timestamp with time zone, p_updated_before timestamp with time zone) TO arm_readonly;


--
-- Name: FUNCTION mark_republished(p_job_ids uuid[]); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.mark_republished(p_job_ids uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.mark_republished(p_job_ids uuid[]) TO arm_bridge;


--
-- Name: FUNCTION outbox_ready_age(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.outbox_ready_age() FROM PUBLIC;
GRANT ALL ON FUNCTION arm.outbox_ready_age() TO arm_bridge;
GRANT ALL ON FUNCTION arm.outbox_ready_age() TO arm_api;
GRANT ALL ON FUNCTION arm.outbox_ready_age() TO arm_readonly;


--
-- Name: FUNCTION pace_unheard(p_pipeline arm.pipeline, p_retry_seconds double precision); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.pace_unheard(p_pipeline arm.pipeline, p_retry_seconds double precision) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.pace_unheard(p_pipeline arm.pipeline, p_retry_seconds double precision) TO arm_bridge;


--
-- Name: FUNCTION pace_view(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.pace_view() FROM PUBLIC;
GRANT ALL ON FUNCTION arm.pace_view() TO arm_bridge;
GRANT ALL ON FUNCTION arm.pace_view() TO arm_api;
GRANT ALL ON FUNCTION arm.pace_view() TO arm_readonly;


--
-- Name: FUNCTION pin_in_flight_limit(p_pipeline arm.pipeline, p_limit integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.pin_in_flight_limit(p_pipeline arm.pipeline, p_limit integer) FROM PUBLIC;


--
-- Name: FUNCTION publish_queued_jobs_v2(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.publish_queued_jobs_v2(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.publish_queued_jobs_v2(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer) TO arm_bridge;


--
-- Name: FUNCTION publish_queued_jobs_v3(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer, p_pacing text, p_tabular_min integer, p_tabular_max integer, p_image_min integer, p_image_max integer, p_ack_timeout interval, p_max_republish integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.publish_queued_jobs_v3(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer, p_pacing text, p_tabular_min integer, p_tabular_max integer, p_image_min integer, p_image_max integer, p_ack_timeout interval, p_max_republish integer) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.publish_queued_jobs_v3(p_limit integer, p_tabular_reply_timeout interval, p_image_reply_timeout interval, p_tabular_subject text, p_image_subject text, p_max_bytes integer, p_pacing text, p_tabular_min integer, p_tabular_max integer, p_image_min integer, p_image_max integer, p_ack_timeout interval, p_max_republish integer) TO arm_bridge;


--
-- Name: FUNCTION record_bridge(p_name text, p_version text, p_started_at timestamp with time zone, p_nats text, p_listener text, p_loops jsonb, p_held integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.record_bridge(p_name text, p_version text, p_started_at timestamp with time zone, p_nats text, p_listener text, p_loops jsonb, p_held integer) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.record_bridge(p_name text, p_version text, p_started_at timestamp with time zone, p_nats text, p_listener text, p_loops jsonb, p_held integer) TO arm_bridge;


--
-- Name: FUNCTION record_waits(p_phase text, p_counts bigint[]); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.record_waits(p_phase text, p_counts bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.record_waits(p_phase text, p_counts bigint[]) TO arm_bridge;


--
-- Name: FUNCTION retry_file(p_file_id uuid, p_actor text); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.retry_file(p_file_id uuid, p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.retry_file(p_file_id uuid, p_actor text) TO arm_api;


--
-- Name: FUNCTION retry_file_v2(p_file_id uuid, p_actor text, p_expected_job_id uuid); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.retry_file_v2(p_file_id uuid, p_actor text, p_expected_job_id uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.retry_file_v2(p_file_id uuid, p_actor text, p_expected_job_id uuid) TO arm_api;


--
-- Name: FUNCTION retry_file_v3(p_file_id uuid, p_actor text, p_expected_job_id uuid, p_actor_level text); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.retry_file_v3(p_file_id uuid, p_actor text, p_expected_job_id uuid, p_actor_level text) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.retry_file_v3(p_file_id uuid, p_actor text, p_expected_job_id uuid, p_actor_level text) TO arm_api;


--
-- Name: FUNCTION retry_files(p_file_ids uuid[], p_actor text); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.retry_files(p_file_ids uuid[], p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.retry_files(p_file_ids uuid[], p_actor text) TO arm_api;


--
-- Name: FUNCTION retry_files_v2(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[]); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.retry_files_v2(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.retry_files_v2(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[]) TO arm_api;


--
-- Name: FUNCTION retry_files_v3(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[], p_actor_level text); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.retry_files_v3(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[], p_actor_level text) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.retry_files_v3(p_file_ids uuid[], p_actor text, p_expected_job_ids uuid[], p_actor_level text) TO arm_api;


--
-- Name: FUNCTION run_due_tasks(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.run_due_tasks() FROM PUBLIC;
GRANT ALL ON FUNCTION arm.run_due_tasks() TO arm_bridge;


--
-- Name: FUNCTION sample_status(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.sample_status() FROM PUBLIC;


--
-- Name: FUNCTION schedule_with_pg_cron(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.schedule_with_pg_cron() FROM PUBLIC;


--
-- Name: FUNCTION set_periodic_task(p_name text, p_function regprocedure, p_run_every interval, p_enabled boolean); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.set_periodic_task(p_name text, p_function regprocedure, p_run_every interval, p_enabled boolean) FROM PUBLIC;


--
-- Name: FUNCTION set_setting(p_name text, p_value text); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.set_setting(p_name text, p_value text) FROM PUBLIC;


--
-- Name: FUNCTION set_sweep_interval(p_run_every interval); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.set_sweep_interval(p_run_every interval) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.set_sweep_interval(p_run_every interval) TO arm_bridge;


--
-- Name: FUNCTION status_series(p_minutes integer); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.status_series(p_minutes integer) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.status_series(p_minutes integer) TO arm_api;
GRANT ALL ON FUNCTION arm.status_series(p_minutes integer) TO arm_readonly;


--
-- Name: FUNCTION status_view(p_ack_timeout interval); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.status_view(p_ack_timeout interval) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.status_view(p_ack_timeout interval) TO arm_bridge;
GRANT ALL ON FUNCTION arm.status_view(p_ack_timeout interval) TO arm_api;
GRANT ALL ON FUNCTION arm.status_view(p_ack_timeout interval) TO arm_readonly;


--
-- Name: FUNCTION sweep_timeouts(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.sweep_timeouts() FROM PUBLIC;


--
-- Name: FUNCTION tg_count_status_row(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.tg_count_status_row() FROM PUBLIC;


--
-- Name: FUNCTION tg_count_statuses(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.tg_count_statuses() FROM PUBLIC;


--
-- Name: FUNCTION tg_recognition_job__defaults(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.tg_recognition_job__defaults() FROM PUBLIC;


--
-- Name: FUNCTION tg_recognition_job__guard(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.tg_recognition_job__guard() FROM PUBLIC;


--
-- Name: FUNCTION tg_recognition_job__inserted(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.tg_recognition_job__inserted() FROM PUBLIC;


--
-- Name: FUNCTION tg_stored_file__source_role(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.tg_stored_file__source_role() FROM PUBLIC;


--
-- Name: FUNCTION tg_stored_file__touch(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.tg_stored_file__touch() FROM PUBLIC;


--
-- Name: FUNCTION unschedule_pg_cron(); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.unschedule_pg_cron() FROM PUBLIC;


--
-- Name: FUNCTION upload_file(p_bucket text, p_key text, p_original_name text, p_file_type text, p_consolidation_id uuid, p_created_by text, p_bucket_role text); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.upload_file(p_bucket text, p_key text, p_original_name text, p_file_type text, p_consolidation_id uuid, p_created_by text, p_bucket_role text) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.upload_file(p_bucket text, p_key text, p_original_name text, p_file_type text, p_consolidation_id uuid, p_created_by text, p_bucket_role text) TO arm_uploader;


--
-- Name: FUNCTION upload_files(p_files jsonb); Type: ACL; Schema: arm; Owner: arm_owner
--

REVOKE ALL ON FUNCTION arm.upload_files(p_files jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION arm.upload_files(p_files jsonb) TO arm_uploader;


--
-- Name: TABLE archived_file; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.archived_file TO arm_readonly;


--
-- Name: TABLE archived_job; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.archived_job TO arm_readonly;


--
-- Name: TABLE archived_retry_audit; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.archived_retry_audit TO arm_readonly;


--
-- Name: TABLE bridge_instance; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.bridge_instance TO arm_readonly;


--
-- Name: TABLE file_count; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.file_count TO arm_readonly;


--
-- Name: TABLE file_count_delta; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.file_count_delta TO arm_readonly;


--
-- Name: TABLE job_count; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.job_count TO arm_readonly;


--
-- Name: TABLE job_count_delta; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.job_count_delta TO arm_readonly;


--
-- Name: TABLE pace_lane; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.pace_lane TO arm_readonly;


--
-- Name: TABLE pace_sample; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.pace_sample TO arm_readonly;


--
-- Name: TABLE periodic_task; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.periodic_task TO arm_readonly;


--
-- Name: TABLE pipeline_pace; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.pipeline_pace TO arm_readonly;


--
-- Name: TABLE retry_audit; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.retry_audit TO arm_readonly;


--
-- Name: TABLE setting; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.setting TO arm_readonly;


--
-- Name: TABLE status_sample; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.status_sample TO arm_readonly;


--
-- Name: TABLE wait_sample; Type: ACL; Schema: arm; Owner: arm_owner
--

GRANT SELECT ON TABLE arm.wait_sample TO arm_readonly;
