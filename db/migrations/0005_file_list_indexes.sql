-- Indexes of the file list, GET /api/v1/files (arm.list_files in
-- db/functions/75_list_files.sql): a page newest first, (created_at DESC, id DESC) after a
-- keyset, costs one index walk of p_limit entries at any table size — with no filter, and
-- with a file status filter (one walk per status). benchmarks/files.py measures both at
-- 10,000 and 1,000,000 files.
--
-- The price: stored_file_status_created_idx covers `status`, so a file's status change is
-- no longer a HOT update (0003): it writes an entry in every index of the table. A file
-- changes status two or three times in its life; the list of failed files at night is what
-- operators asked for.
-- depends: 0004_job_and_file_counts

CREATE INDEX stored_file_created_idx ON arm.stored_file (created_at DESC, id DESC);
CREATE INDEX stored_file_status_created_idx
    ON arm.stored_file (status, created_at DESC, id DESC);
