-- Rolls back 0015: the audit's actor_level, in the hot table and the archive (the levels
-- recorded go with it), and the retry functions that write it. arm.retry_file_v2,
-- arm.retry_files_v2, arm.retry_file, arm.retry_files, arm.get_file and
-- arm.archive_files come back as they were with the functions of the release rolled
-- back to (its migrate re-applies them).
DROP FUNCTION IF EXISTS arm.retry_files_v3(uuid[], text, uuid[], text);
DROP FUNCTION IF EXISTS arm.retry_file_v3(uuid, text, uuid, text);
ALTER TABLE arm.archived_retry_audit DROP COLUMN IF EXISTS actor_level;
ALTER TABLE arm.retry_audit DROP COLUMN IF EXISTS actor_level;
