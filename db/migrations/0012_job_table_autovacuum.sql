-- The live queues' partial indexes (queued, unacked, live deadline, one live job per file)
-- hold an entry for every job that passed through since the table's last vacuum: an entry
-- whose row left the live statuses is removed only by vacuum. PostgreSQL's default
-- autovacuum waits for 20 % of the table's rows to be dead, so the longer the history,
-- the rarer the vacuum and the larger those indexes — an hour's soak saw them double after
-- its warm-up. A fixed threshold makes the vacuum's pace follow the churn, whatever the
-- history: about every 2,000 jobs finished (three dead row versions each).
-- depends: 0011_archived_history

ALTER TABLE arm.recognition_job SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000
);
