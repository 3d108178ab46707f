-- Rolls back 0009: the delta rows get their identity column and primary key again.
ALTER TABLE arm.job_count_delta
    ADD COLUMN IF NOT EXISTS id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
ALTER TABLE arm.file_count_delta
    ADD COLUMN IF NOT EXISTS id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
