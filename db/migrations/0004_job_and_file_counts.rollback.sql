-- Rolls back 0004: the count triggers, their function and the count tables. (The
-- functions of db/functions/80_status.sql that read them come back with the release
-- rolled back to, which has none.)
DROP TRIGGER IF EXISTS tg_recognition_job__count_insert ON arm.recognition_job;
DROP TRIGGER IF EXISTS tg_recognition_job__count_update ON arm.recognition_job;
DROP TRIGGER IF EXISTS tg_recognition_job__count_delete ON arm.recognition_job;
DROP TRIGGER IF EXISTS tg_recognition_job__count_truncate ON arm.recognition_job;
DROP TRIGGER IF EXISTS tg_stored_file__count_insert ON arm.stored_file;
DROP TRIGGER IF EXISTS tg_stored_file__count_update ON arm.stored_file;
DROP TRIGGER IF EXISTS tg_stored_file__count_delete ON arm.stored_file;
DROP TRIGGER IF EXISTS tg_stored_file__count_truncate ON arm.stored_file;
DROP FUNCTION IF EXISTS arm.job_counts();
DROP FUNCTION IF EXISTS arm.file_counts();
DROP FUNCTION IF EXISTS arm.compact_counts();
DROP FUNCTION IF EXISTS arm.status_view(interval);
DROP FUNCTION IF EXISTS arm.publish_queued_jobs_v2(integer, interval, interval, text, text, integer);
DROP FUNCTION IF EXISTS arm.apply_envelopes_v2(jsonb);
DROP FUNCTION IF EXISTS arm.tg_count_statuses();
DROP TABLE IF EXISTS arm.job_count, arm.job_count_delta, arm.file_count, arm.file_count_delta;
