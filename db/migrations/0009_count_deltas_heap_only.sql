-- The delta tables of the counts (migration 0004) lose their identity column and with it
-- their primary key: a delta row is only ever appended by a count trigger and taken by
-- arm.compact_counts() (`DELETE … RETURNING` of every row it sees), so nothing looks one
-- up. Every counted write statement (each upload has three) paid for a sequence value and
-- a B-tree entry it never used — about 40 µs and 60 bytes of WAL per upload, measured
-- (docs/benchmarks.md, uploads and WAL).
-- depends: 0008_stored_file_hot_updates

ALTER TABLE arm.job_count_delta DROP COLUMN id;
ALTER TABLE arm.file_count_delta DROP COLUMN id;
