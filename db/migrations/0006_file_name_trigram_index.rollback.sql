-- Rolls back 0006: the trigram index of the file list's q. pg_trgm stays: other
-- objects of the database may use it, and it was perhaps there before 0006.
-- arm.fold_name stays too (db/functions/75_list_files.sql defines it).
DROP INDEX IF EXISTS arm.stored_file_name_trgm_idx;
