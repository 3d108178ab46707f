-- Pacing (docs/pacing.md): the publisher hands a pipeline's service no more jobs than it
-- can finish, and when there is room, the next job comes from the consolidation served
-- least lately. The tables come from migration 0016.
--
-- In flight = the pipeline's published + processing jobs. The limit on it:
--   * off   — none: every queued job is published at once, oldest first (the release
--             before pacing);
--   * fixed — <PIPELINE>_MAX_IN_FLIGHT, for a service of known capacity;
--   * auto  — adapted to the service from its answers (arm._pace_room), between
--             <PIPELINE>_MIN_IN_FLIGHT and <PIPELINE>_MAX_IN_FLIGHT.
-- A limit a DBA pins (arm.pin_in_flight_limit) replaces the other two until unpinned.
--
-- Shared by every bridge without overshooting: a paced claim locks its pipeline's row of
-- arm.pipeline_pace (FOR UPDATE SKIP LOCKED) and keeps it to the end of its transaction
-- — the one that publishes the batch and commits it. So one claim per pipeline at a
-- time, across all bridges; the next one counts in flight after the previous one
-- committed (READ COMMITTED: each statement sees what committed before it) and takes at
-- most limit - in flight. A claimer that finds the row locked takes nothing from that
-- pipeline this time (its other drains and the other pipeline go on). In flight is never
-- above the limit a claim saw; it is above a limit that shrank since, until answers
-- bring it down.

-- The adaptive limit (mode auto): adjusted to what the pipeline's service showed since
-- the last adjustment, inside the paced claim (arm._pace_room, below), under the
-- pipeline's row lock, at most once per window (the least publish → answer time seen,
-- at least 0.1 s, at most 1 s).
--
-- The algorithm is TCP Vegas as Netflix's concurrency-limits library applies it to a
-- remote service: compare the answers' latency with the least latency seen (the
-- service's own time per file, nothing queued in front of it); their ratio says how many
-- of the jobs in flight are waiting in the service's queue:
--   queue = in flight × (1 - base / latency),  base = the least latency, at least 0.5 s.
-- Below half a second a latency says nothing of the service's queue: arm-core's own
-- round trip (a publish batch confirmed, the answers' batch applied and committed) grows
-- with the jobs in flight when the service answers at once, and taken for queueing it
-- held the limit near a batch of a dozen, a fifth of what the bridge carries unpaced.
-- Half a second of a recognition service's queue costs nothing against a reply
-- deadline of minutes.
-- A few waiting (3 to 6) keep every worker busy across the time an answer takes to come
-- back and the next request to go out; more only add to every job's wait. So:
--   * queue below 1: grow by half per latency (at least 1 a window) — a slow start
--     that doubles in a couple of latencies (the limit starts at the floor); grown
--     faster, it outruns the answers that would show the queue it builds;
--   * queue below 3: grow by 1;  above 6: shrink by half the excess per latency (a
--     window shorter than the latency takes its share: the answers it saw reflect the
--     queue as it was a latency ago, and shrinking by half the excess in every 0.1 s
--     window drove the limit to the floor and back, a sawtooth);
--   * answers taking more than half the reply deadline: halve — whatever the queue
--     says, jobs are about to time out;
--   * the limit not in use (in flight below half of it): unchanged — an idle service
--     proves nothing about more.
-- An ack timeout with no ack nor answer in the window means the service stopped
-- answering: the limit falls to the floor and `answering` is false until an ack or an
-- answer arrives (arm._pace_room then sends nothing new but a lone probe). After a
-- quiet spell of 3 ack timeouts with nothing in flight the limit falls to the floor as
-- well (TCP's restart after idle): a service that went away meanwhile then costs at most
-- the floor in dead letters, not a whole limit.
-- Why Vegas and not AIMD on timeouts: the service's queue is seen long before any
-- deadline passes (the jobs it holds wait in its queue, their reply deadline running),
-- and AIMD would learn the capacity only from jobs lost to a timeout. Gradient2 (the same
-- library's default) needs per-request samples at a high rate to smooth its gradient;
-- a recognition service answers a few to a few hundred files a second.
-- How many jobs of p_pipeline the claim running in this transaction may publish now
-- (room), or 0 when another claim holds the pipeline (its transaction has the row) or
-- there is no room; probe: the one job is a probe (below). Records the bridges' settings in the pipeline's row, adjusts the limit (auto),
-- and keeps the row locked to the end of the transaction. While the service is not
-- answering, the room is a single probe when nothing is in flight, a republish budget
-- (ack timeout × (1 + OUTBOX_MAX_REPUBLISH)) after it fell silent or after the last
-- probe. The publisher sends a probe with a reply subject: when nobody subscribes to the
-- request subject, the NATS server says so at once (no responders) and the publisher
-- rolls the probe back — it stays queued, nothing is spent — and asks again a second
-- later (arm.pace_unheard). So a service that is away costs no dead letter past those
-- in flight when it went; one that is subscribed but silent (hung) costs the probe,
-- one per budget.
CREATE OR REPLACE FUNCTION arm._pace_room(
    p_pipeline arm.pipeline,
    p_mode text,
    p_min integer,
    p_max integer,
    p_reply_timeout interval,
    p_ack_timeout interval,
    p_max_republish integer,
    OUT room integer,
    OUT probe boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- Adds the lanes of p_pipeline's queued jobs that have none (a lane the claim dropped as
-- empty while an upload into it had not committed yet); returns how many it added. A
-- loose scan of recognition_job_queued_lane_idx: one descent per lane, whatever the
-- backlog. The paced claim calls it when its lanes ran dry with room left.
CREATE OR REPLACE FUNCTION arm._repair_lanes(p_pipeline arm.pipeline)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- Up to p_n queued jobs of p_pipeline, round robin over its lanes: the first job of each
-- lane in the order they were last served (least lately first; a new lane first of all),
-- then the second of each, and so on; oldest first within a lane. Reads at most the p_n
-- least lately served lanes and about p_n jobs from recognition_job_queued_lane_idx
-- (a lane shorter than its share leaves another round), whatever the backlog or the
-- number of lanes. The lanes served get served_at now; a lane found empty is dropped.
-- Runs under the pipeline's row lock (arm._pace_room): the only writer of served_at and
-- of the drop, so it waits for no other claim; an upload adding a lane takes no lock on
-- one that exists. Locks what it returns (rows another session holds are skipped).
CREATE OR REPLACE FUNCTION arm._claim_fair(p_pipeline arm.pipeline, p_n integer)
RETURNS uuid[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- The paced publisher's claim: arm.publish_queued_jobs_v2 with the in-flight limits
-- above. p_pacing is PACING (auto, fixed, off); p_*_min and p_*_max are the pipelines'
-- <PIPELINE>_MIN_IN_FLIGHT and <PIPELINE>_MAX_IN_FLIGHT; p_ack_timeout and
-- p_max_republish are the bridge's ACK_TIMEOUT_SECONDS and OUTBOX_MAX_REPUBLISH (the
-- not-answering signal and the probe's pace). Each paced pipeline gives up to
-- min(p_limit, its room) jobs, round robin over its lanes; off claims as v2 does
-- (oldest first, at most p_limit). Returns what v2 returns and, per job, whether it is a
-- probe of a service that stopped answering (the publisher sends it with a reply subject
-- and rolls it back when nobody listens). Must run inside the transaction that publishes
-- and then commits.
CREATE OR REPLACE FUNCTION arm.publish_queued_jobs_v3(
    p_limit integer,
    p_tabular_reply_timeout interval,
    p_image_reply_timeout interval,
    p_tabular_subject text,
    p_image_subject text,
    p_max_bytes integer,
    p_pacing text,
    p_tabular_min integer,
    p_tabular_max integer,
    p_image_min integer,
    p_image_max integer,
    p_ack_timeout interval,
    p_max_republish integer
)
RETURNS TABLE (
    job_id uuid,
    attempt integer,
    file_id uuid,
    outcome text,
    subject text,
    msg_id text,
    request text,
    error_message text,
    queued_seconds double precision,
    probe boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- Nobody listens on p_pipeline's request subject (the NATS server answered a probe with
-- no responders; the publisher rolled it back): the pipeline is not answering, and the
-- next probe may go in p_retry_seconds — it costs nothing while nobody listens.
CREATE OR REPLACE FUNCTION arm.pace_unheard(p_pipeline arm.pipeline, p_retry_seconds double precision)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    UPDATE arm.pipeline_pace
    SET answering = false,
        silent_since = coalesce(silent_since, clock_timestamp()),
        probe_after = clock_timestamp() + make_interval(secs => p_retry_seconds)
    WHERE pipeline = p_pipeline;
END;
$$;

-- Pins a pipeline's in-flight limit (a DBA's decision: a service whose capacity is
-- known, or to hold a pipeline back — at least 1); NULL unpins it (mode auto adapts
-- again from the limit it had). Takes effect at the next claim. Returns the pipeline,
-- its pinned limit and its adaptive one.
CREATE OR REPLACE FUNCTION arm.pin_in_flight_limit(p_pipeline arm.pipeline, p_limit integer)
RETURNS TABLE (pipeline arm.pipeline, pinned_limit integer, adaptive_limit double precision)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- How long the oldest job that pacing does not hold back has been queued, in seconds (0
-- when there is none): a job of a pipeline that is not paced (mode off), or that has room
-- under its limit while its service answers. What a stuck publisher leaves waiting —
-- while a paced burst or a service that is away holds jobs back on purpose (pace_view
-- counts them), which is not stuck. The health check's `outbox` and the gauge
-- arm_outbox_oldest_ready_age_seconds (the alert ArmCoreOutboxStuck) read it.
--
-- Cost: with nothing held back, the first entry of recognition_job_queued_idx; else the
-- in-flight count of each paced pipeline (at most its limit) and one descent of
-- recognition_job_queued_lane_idx per lane of the pipelines with room — never the backlog
-- the limit holds.
CREATE OR REPLACE FUNCTION arm.outbox_ready_age()
RETURNS double precision
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- Per pipeline, what pacing is doing (GET /api/v1/status, /metrics, the console):
-- the mode, the limit in effect (NULL when off), in flight, queued, held back (queued
-- jobs the limit keeps back now: all of them while the service is not answering, those
-- beyond the room otherwise), whether the service answers and since when it has not,
-- the last window's latency and answers per second.
CREATE OR REPLACE FUNCTION arm.pace_view()
RETURNS TABLE (
    pipeline arm.pipeline,
    mode text,
    in_flight_limit integer,
    pinned boolean,
    in_flight bigint,
    queued bigint,
    held_back bigint,
    answering boolean,
    silent_since timestamptz,
    latency_seconds double precision,
    min_latency_seconds double precision,
    answers_per_second double precision
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
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

-- Jobs queued without a lane (by the previous release's bridges or API while this one
-- migrated) get it, in this file's transaction and under the lock 80_status.sql takes
-- too; the paced claim adds the lanes they need (arm._repair_lanes).
DO $lanes$
BEGIN
    IF to_regclass('arm.pace_lane') IS NULL THEN
        RETURN;
    END IF;
    LOCK TABLE arm.recognition_job, arm.stored_file IN SHARE ROW EXCLUSIVE MODE;
    UPDATE arm.recognition_job j
    SET lane = coalesce(f.consolidation_id, '00000000-0000-0000-0000-000000000000')
    FROM arm.stored_file f
    WHERE f.id = j.file_id AND j.status = 'queued' AND j.lane IS NULL;
END;
$lanes$;
