-- The console's charts of the last hour (GET /api/v1/status/series): a bounded time
-- series the database keeps (db/functions/82_samples.sql).
--   status_sample  one row per run of the periodic task sample_status (every minute):
--                  the jobs per status at that moment, the oldest queued job's age, and
--                  the waits the bridges observed since the sample before, per phase as
--                  counts per bucket of arm.wait_bucket_bounds(). Finished jobs per minute
--                  are the differences of the final statuses' counts between two samples:
--                  nothing is written per job for the charts.
--   wait_sample    what the bridges hand over every 15 s (the same observations as the
--                  histogram arm_job_wait_seconds{phase}), one row per bridge and phase
--                  that had any, until the next sample folds it into its row and deletes
--                  it (like the count deltas of 0004): about a minute's rows at a time.
-- sample_status() deletes the samples older than a day: at most about 1,440 rows.
-- depends: 0009_count_deltas_heap_only

CREATE TABLE arm.status_sample (
    sampled_at                timestamptz PRIMARY KEY,
    jobs                      jsonb NOT NULL,
    oldest_queued_age_seconds double precision NOT NULL,
    queued_waits              bigint[],
    ack_waits                 bigint[],
    processing_waits          bigint[]
);

CREATE TABLE arm.wait_sample (
    recorded_at timestamptz NOT NULL,
    phase       text NOT NULL CHECK (phase IN ('queued', 'ack', 'processing')),
    counts      bigint[] NOT NULL CHECK (cardinality(counts) >= 1)
);
