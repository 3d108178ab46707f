-- Rolls back 0010: the sampling task, its functions and the two sample tables. (The
-- release rolled back to has no charts and none of these functions.)
DELETE FROM arm.periodic_task WHERE name = 'sample_status';
DROP FUNCTION IF EXISTS arm.sample_status();
DROP FUNCTION IF EXISTS arm.record_waits(text, bigint[]);
DROP FUNCTION IF EXISTS arm.status_series(integer);
DROP FUNCTION IF EXISTS arm.wait_summary(bigint[]);
DROP FUNCTION IF EXISTS arm.wait_quantile(double precision, bigint[]);
DROP FUNCTION IF EXISTS arm.wait_bucket_bounds();
DROP TABLE IF EXISTS arm.status_sample, arm.wait_sample;
