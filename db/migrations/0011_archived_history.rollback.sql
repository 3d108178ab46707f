-- Rolls back 0011: the archive's tables and function. The archived files go with them
-- (the release rolled back to has no archive): dump the three tables first to keep them.
DROP FUNCTION IF EXISTS arm.archive_files(timestamptz, integer);
DROP TABLE IF EXISTS arm.archived_retry_audit, arm.archived_job, arm.archived_file;
