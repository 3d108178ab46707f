-- The delta tables of the counts (migration 0004) lose their identity column and with it
-- their primary key: a delta row is only ever appended by a count trigger and taken by
-- arm.compact_counts() (`DELETE … RETURNING` of every row it sees), so nothing looks one
-- up. Every counted write statement paid for a sequence value and a B-tree entry it never
-- used: an upload's WAL went from 2,586 to 2,441 bytes without them (B-tree 1,172 →
-- 1,036; docs/benchmarks.md, WAL).
-- depends: 0008_stored_file_hot_updates

ALTER TABLE arm.job_count_delta DROP COLUMN id;
ALTER TABLE arm.file_count_delta DROP COLUMN id;
