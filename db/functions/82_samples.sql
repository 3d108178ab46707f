-- The console's charts of the last hour: a time series the database keeps, bounded
-- (migration 0010). A DBA reads the same series the page draws:
--   SELECT * FROM arm.status_series(60);
-- arm.sample_status() runs every minute from the schedule (periodic task sample_status);
-- the bridges add their observed waits with arm.record_waits() every 15 s
-- (bridge/scheduler.py, BridgeConfig.wait_sample_seconds).

-- The upper bounds of the wait buckets, in seconds: those of the histogram
-- arm_job_wait_seconds (src/arm_core/instruments.py JOB_WAIT_BUCKETS;
-- tests/integration/test_status_series.py holds the two equal). A row of arm.wait_sample has one count per bound and one more, last,
-- for the waits above the highest.
CREATE OR REPLACE FUNCTION arm.wait_bucket_bounds()
RETURNS double precision[]
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT '{0.01,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,120,300,600,1800,3600}'::double precision[]
$$;

-- The q-quantile (0 < q < 1) of waits counted per bucket of wait_bucket_bounds(), as
-- Prometheus's histogram_quantile estimates it: linear within the bucket the rank falls
-- in, from 0 for the first bucket; the highest bound when it falls above it. NULL when
-- nothing was counted.
CREATE OR REPLACE FUNCTION arm.wait_quantile(q double precision, counts bigint[])
RETURNS double precision
LANGUAGE plpgsql
IMMUTABLE
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

-- The periodic task sample_status: one row of arm.status_sample — the jobs per status,
-- the oldest queued job's age (the figures of arm.status_view, read the same bounded
-- way) and the bridges' waits handed over since the last sample, summed per phase and
-- bucket; the wait rows it took are deleted (one handed over meanwhile waits for the
-- next sample), those older than 10 minutes dropped unsummed (no sample ran: a gap).
-- Samples older than a day go. Returns what it sampled.
CREATE OR REPLACE FUNCTION arm.sample_status()
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- A bridge's waits of one phase ('queued', 'ack' or 'processing') since its last call:
-- one count per bucket of wait_bucket_bounds() and one for the waits above the highest.
-- Counts of nothing are not stored. Raises invalid_parameter_value on a wrong phase, a
-- wrong number of counts or a negative one.
CREATE OR REPLACE FUNCTION arm.record_waits(p_phase text, p_counts bigint[])
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- One phase's waits of a sample as the series shows them: {"n": …, "p50": s, "p99": s},
-- or NULL when there were none.
CREATE OR REPLACE FUNCTION arm.wait_summary(counts bigint[])
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT CASE WHEN n > 0 THEN jsonb_build_object(
               'n', n,
               'p50', round(arm.wait_quantile(0.5, counts)::numeric, 3),
               'p99', round(arm.wait_quantile(0.99, counts)::numeric, 3)) END
    FROM (SELECT sum(c)::bigint AS n FROM unnest(counts) AS c) t
$$;

-- The series of the last p_minutes (1 to 1,440), oldest first, one row per sample:
--   sampled_at, seconds          when, and the seconds since the sample before (NULL for
--                                the first one after a gap of more than 10 minutes)
--   finished                     jobs that reached each final status in those seconds:
--                                {"done": n, "needs_check": n, "error": n, "timeout": n,
--                                "dlq": n} (a status whose count fell — a purge — is 0)
--   queued                       jobs queued at that moment
--   oldest_queued_age_seconds    the oldest queued job's age then (0 when none)
--   waits                        per phase, the waits the bridges observed in those
--                                seconds: {"queued": {"n": …, "p50": s, "p99": s}, …}
--                                ({} when none)
-- finished and waits are NULL when seconds is. Reads the samples alone: a day of them
-- costs what 1,440 rows cost.
CREATE OR REPLACE FUNCTION arm.status_series(p_minutes integer DEFAULT 60)
RETURNS TABLE (
    sampled_at timestamptz,
    seconds double precision,
    finished jsonb,
    queued bigint,
    oldest_queued_age_seconds double precision,
    waits jsonb
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- The task this file ships (a DBA's later changes to run_every or enabled are kept).
INSERT INTO arm.periodic_task (name, function_name, run_every)
VALUES ('sample_status', 'arm.sample_status()', interval '1 minute')
ON CONFLICT (name) DO NOTHING;
