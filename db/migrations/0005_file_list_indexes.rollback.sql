-- Rolls back 0005: the file list's indexes.
DROP INDEX IF EXISTS arm.stored_file_status_created_idx;
DROP INDEX IF EXISTS arm.stored_file_created_idx;
