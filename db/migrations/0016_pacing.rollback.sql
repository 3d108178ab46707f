-- Rolls back 0016: pacing's tables, the job's lane (and the archive's) and their
-- indexes. The functions come back as they were with the release rolled back to (its
-- migrate re-applies them); its bridges publish every queued job at once, as before.
DROP FUNCTION IF EXISTS arm.publish_queued_jobs_v3(integer, interval, interval, text, text,
    integer, text, integer, integer, integer, integer, interval, integer);
DROP FUNCTION IF EXISTS arm.pin_in_flight_limit(arm.pipeline, integer);
DROP FUNCTION IF EXISTS arm.pace_unheard(arm.pipeline, double precision);
DROP FUNCTION IF EXISTS arm.pace_view();
DROP FUNCTION IF EXISTS arm.outbox_ready_age();
DROP FUNCTION IF EXISTS arm._pace_room(arm.pipeline, text, integer, integer, interval,
    interval, integer);
DROP FUNCTION IF EXISTS arm._claim_fair(arm.pipeline, integer);
DROP FUNCTION IF EXISTS arm._publish_claimed(uuid[], interval, interval, text, text,
    integer);
DROP FUNCTION IF EXISTS arm._repair_lanes(arm.pipeline);
DROP TABLE IF EXISTS arm.pace_lane;
DROP TABLE IF EXISTS arm.pace_sample;
DROP TABLE IF EXISTS arm.pipeline_pace;
DROP INDEX IF EXISTS arm.recognition_job_in_flight_idx;
DROP INDEX IF EXISTS arm.recognition_job_queued_lane_idx;
ALTER TABLE arm.archived_job DROP COLUMN IF EXISTS lane;
-- With the defaults trigger, whose WHEN reads the lane: the previous release's migrate,
-- run next, creates it again as it was (its function files), like every function here.
ALTER TABLE arm.recognition_job DROP COLUMN IF EXISTS lane CASCADE;
