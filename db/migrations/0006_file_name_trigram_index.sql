-- The trigram index of the file list's q (issue 11; arm.list_files in
-- db/functions/75_list_files.sql). Skeleton: filled in by the next commit.
-- depends: 0005_file_list_indexes

SELECT 1;
