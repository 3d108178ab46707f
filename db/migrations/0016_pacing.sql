-- Pacing: how many jobs of a pipeline may be in the service's hands at once (published
-- or processing), shared by every bridge through the database, and which queued job goes
-- next when there is room (db/functions/22_pacing.sql, docs/pacing.md).
--
-- * arm.pipeline_pace: one row per pipeline, the limit and what it was adapted from.
--   The claim locks its pipeline's row for the rest of its transaction, so the claims of
--   a paced pipeline follow one another, each seeing what the one before committed.
-- * arm.pace_sample: what the inbox applied, per batch and pipeline (answers and acks and
--   how long they took since the publish); the limit's next adjustment takes them.
-- * arm.pace_lane: the consolidations (lanes) that have queued jobs, per pipeline, and
--   when one of their jobs was last claimed; the claim serves the least recently served
--   lanes first. A job queued in a new lane adds it (the count triggers, 80_status.sql);
--   the paced claim drops a lane it finds empty.
-- * recognition_job.lane: the file's consolidation_id (the nil uuid for a file that has
--   none), copied when the job is made so that the claim can read a lane's oldest queued
--   jobs from one index. NULL on jobs that were final before this migration; every job
--   queued now gets its lane below.
--
-- The new column is nullable without a default: only the catalog changes (no rewrite).
-- The archive keeps the columns of its hot table, in the same order.
-- depends: 0015_retry_actor_level

ALTER TABLE arm.recognition_job ADD COLUMN lane uuid;
ALTER TABLE arm.archived_job ADD COLUMN lane uuid;

UPDATE arm.recognition_job j
SET lane = coalesce(f.consolidation_id, '00000000-0000-0000-0000-000000000000')
FROM arm.stored_file f
WHERE f.id = j.file_id AND j.status = 'queued';

-- The paced claim: a lane's oldest queued jobs.
CREATE INDEX recognition_job_queued_lane_idx ON arm.recognition_job (pipeline, lane, requested_at, id)
    WHERE status = 'queued';
-- In flight per pipeline, counted at every paced claim (at most the limit's rows).
CREATE INDEX recognition_job_in_flight_idx ON arm.recognition_job (pipeline)
    INCLUDE (status, published_at, last_published_at)
    WHERE status IN ('published', 'processing');

CREATE TABLE arm.pipeline_pace (
    pipeline            arm.pipeline PRIMARY KEY,
    -- As the bridges' last paced claim set them (PACING, <PIPELINE>_MIN_IN_FLIGHT and
    -- <PIPELINE>_MAX_IN_FLIGHT).
    mode                text NOT NULL DEFAULT 'off' CHECK (mode IN ('auto', 'fixed', 'off')),
    min_in_flight       integer NOT NULL DEFAULT 1 CHECK (min_in_flight >= 1),
    max_in_flight       integer NOT NULL DEFAULT 1000 CHECK (max_in_flight >= min_in_flight),
    -- The adaptive limit (mode auto); fractional while it grows by parts of a job.
    adaptive_limit      double precision NOT NULL DEFAULT 1 CHECK (adaptive_limit >= 1),
    -- Set by a DBA (arm.pin_in_flight_limit): the limit in every mode but off.
    pinned_limit        integer CHECK (pinned_limit >= 1),
    -- Publish → result of the last window's answers, and the least seen (the service's
    -- own time per file, with no queue in front of it).
    latency_seconds     double precision,
    min_latency_seconds double precision,
    answers_per_second  double precision,
    -- False from the first ack timeout with no answer since until the next answer.
    answering           boolean NOT NULL DEFAULT true,
    silent_since        timestamptz,
    -- While not answering: when one job may go out as a probe.
    probe_after         timestamptz,
    adjusted_at         timestamptz NOT NULL DEFAULT now()
);
INSERT INTO arm.pipeline_pace (pipeline)
SELECT p FROM unnest(enum_range(NULL::arm.pipeline)) AS p;

CREATE TABLE arm.pace_sample (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline       arm.pipeline NOT NULL,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    answers        integer NOT NULL,
    answer_seconds double precision NOT NULL,
    acks           integer NOT NULL,
    ack_seconds    double precision NOT NULL
);
CREATE INDEX pace_sample_pipeline_idx ON arm.pace_sample (pipeline, id);

CREATE TABLE arm.pace_lane (
    pipeline  arm.pipeline NOT NULL,
    lane      uuid NOT NULL,
    served_at timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (pipeline, lane)
);
CREATE INDEX pace_lane_served_idx ON arm.pace_lane (pipeline, served_at, lane);
INSERT INTO arm.pace_lane (pipeline, lane)
SELECT DISTINCT j.pipeline, j.lane
FROM arm.recognition_job j
WHERE j.status = 'queued';
