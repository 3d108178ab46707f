-- Per-status counts of jobs and files that cost what the live jobs cost, not the history
-- (issue 11: arm_jobs{status}, the status view). Skeleton: filled in by the metrics work.
-- depends: 0003_stored_file_fillfactor

SELECT 1;
