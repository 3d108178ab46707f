-- Rolls back 0012: the job table's autovacuum follows the server's settings again.
ALTER TABLE arm.recognition_job RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
