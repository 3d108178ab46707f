-- The core schema of the recognition job exchange (docs/behaviour.md#data-model, #state-machine).
-- Tables, types and indexes change only through numbered migrations; the functions and
-- triggers that act on them live in db/functions and are re-applied on every migrate.
-- depends:

CREATE SCHEMA IF NOT EXISTS arm;

CREATE TYPE arm.bucket_role AS ENUM ('uploads', 'results', 'raw');
CREATE TYPE arm.file_type AS ENUM ('XLS', 'XLSX', 'XLSB', 'PDF', 'PNG', 'JPG');
CREATE TYPE arm.pipeline AS ENUM ('tabular', 'image');
-- The exchange uses UPLOADED, PROCESSING and ERROR; the mapping step adds its own later.
CREATE TYPE arm.file_status AS ENUM ('UPLOADED', 'PROCESSING', 'ERROR');
CREATE TYPE arm.job_status AS ENUM (
    'queued', 'published', 'processing', 'done', 'needs_check', 'error', 'timeout', 'dlq'
);

-- Settings the database itself needs where no process is involved (a plain SQL upload
-- takes max_attempts from here). `arm-core migrate` writes them from the environment.
CREATE TABLE arm.setting (
    name        text PRIMARY KEY,
    value       text NOT NULL,
    description text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO arm.setting (name, value, description) VALUES
    ('default_max_attempts', '3', 'max_attempts of a new upload''s job (DEFAULT_MAX_ATTEMPTS)');

CREATE TABLE arm.s3_object (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    bucket      text NOT NULL CHECK (bucket <> ''),
    key         text NOT NULL CHECK (key <> ''),
    bucket_role arm.bucket_role NOT NULL,
    created_by  text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX s3_object_bucket_key_idx ON arm.s3_object (bucket, key);

CREATE TABLE arm.stored_file (
    id                         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    consolidation_id           uuid,
    original_name              text NOT NULL CHECK (original_name <> ''),
    file_type                  arm.file_type NOT NULL,
    s3_object_id               uuid NOT NULL REFERENCES arm.s3_object (id),
    status                     arm.file_status NOT NULL DEFAULT 'UPLOADED',
    current_recognition_job_id uuid,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    updated_at                 timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stored_file_consolidation_idx ON arm.stored_file (consolidation_id);
CREATE INDEX stored_file_current_job_idx ON arm.stored_file (current_recognition_job_id);

CREATE TABLE arm.recognition_job (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    file_id               uuid NOT NULL REFERENCES arm.stored_file (id),
    -- NULL on insert means "by the file's type" (trigger tg_recognition_job__defaults).
    pipeline              arm.pipeline NOT NULL,
    attempt               integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    -- NULL on insert means arm.setting 'default_max_attempts' (same trigger).
    max_attempts          integer NOT NULL CHECK (max_attempts >= 1),
    status                arm.job_status NOT NULL DEFAULT 'queued',
    requested_at          timestamptz NOT NULL DEFAULT now(),
    published_at          timestamptz,
    request_msg_id        text,
    request_subject       text,
    reply_deadline        timestamptz,
    -- Republish bookkeeping (R-ACK-2): how many times the request went out again
    -- without an ack, and when it last went out.
    republish_count       integer NOT NULL DEFAULT 0 CHECK (republish_count >= 0),
    last_published_at     timestamptz,
    started_at            timestamptz,
    finished_at           timestamptz,
    service_name          text,
    service_version       text,
    metrics               jsonb,
    error_code            text,
    error_message         text,
    result_schema_version text,
    result_s3_object_id   uuid REFERENCES arm.s3_object (id),
    result_msg_id         text,
    group_schema          jsonb,
    CONSTRAINT recognition_job_file_attempt_key UNIQUE (file_id, attempt),
    -- Lets stored_file reference (job, file) together: a file's current job is its own.
    CONSTRAINT recognition_job_id_file_key UNIQUE (id, file_id),
    -- Everything a publish writes is present exactly when the job has been published.
    CONSTRAINT recognition_job_published_fields CHECK (
        (status = 'queued') = (published_at IS NULL)
        AND (status = 'queued') = (request_msg_id IS NULL)
        AND (status = 'queued') = (request_subject IS NULL)
        AND (status = 'queued') = (reply_deadline IS NULL)
        AND (status = 'queued') = (last_published_at IS NULL)
    ),
    CONSTRAINT recognition_job_republish_only_when_published CHECK (
        republish_count = 0 OR status <> 'queued'
    ),
    -- An ack sets started_at and the service; a job in processing always has them.
    CONSTRAINT recognition_job_started_fields CHECK (
        status <> 'processing' OR (started_at IS NOT NULL AND service_name IS NOT NULL)
    ),
    CONSTRAINT recognition_job_not_started_yet CHECK (
        status NOT IN ('queued', 'published') OR started_at IS NULL
    ),
    -- finished_at is present exactly when the status is final.
    CONSTRAINT recognition_job_finished_at CHECK (
        (status IN ('done', 'needs_check', 'error', 'timeout', 'dlq')) = (finished_at IS NOT NULL)
    ),
    -- An error code is present exactly for the unsuccessful final statuses.
    CONSTRAINT recognition_job_error_code CHECK (
        (status IN ('error', 'timeout', 'dlq')) = (error_code IS NOT NULL)
    ),
    CONSTRAINT recognition_job_error_message CHECK (
        error_message IS NULL OR error_code IS NOT NULL
    ),
    -- A result applied from the inbox always carries its message id; nothing else does.
    CONSTRAINT recognition_job_result_msg_id CHECK (
        (status IN ('done', 'needs_check', 'error')) = (result_msg_id IS NOT NULL)
    ),
    -- done/needs_check always point at their result file and its schema version.
    CONSTRAINT recognition_job_result_object CHECK (
        status NOT IN ('done', 'needs_check')
        OR (result_s3_object_id IS NOT NULL AND result_schema_version IS NOT NULL)
    ),
    CONSTRAINT recognition_job_no_result_while_live CHECK (
        status NOT IN ('queued', 'published', 'processing')
        OR (result_s3_object_id IS NULL AND metrics IS NULL AND result_schema_version IS NULL)
    ),
    -- Only mapping fills group_schema, and only for a successful job.
    CONSTRAINT recognition_job_group_schema CHECK (
        group_schema IS NULL OR status IN ('done', 'needs_check')
    ),
    CONSTRAINT recognition_job_attempt_limit CHECK (attempt <= max_attempts)
);

-- At most one live (non-final) job per file.
CREATE UNIQUE INDEX recognition_job_one_live_per_file_idx
    ON arm.recognition_job (file_id)
    WHERE status IN ('queued', 'published', 'processing');
-- The publisher's queue: only queued rows, so it stays small as history grows.
CREATE INDEX recognition_job_queued_idx
    ON arm.recognition_job (requested_at)
    WHERE status = 'queued';
-- Jobs waiting for an ack, by when they last went out (republish / dead-letter).
CREATE INDEX recognition_job_unacked_idx
    ON arm.recognition_job (last_published_at)
    WHERE status = 'published';
-- Deadlines of live jobs (the timeout sweep).
CREATE INDEX recognition_job_live_deadline_idx
    ON arm.recognition_job (reply_deadline)
    WHERE status IN ('published', 'processing');
CREATE INDEX recognition_job_result_s3_object_idx
    ON arm.recognition_job (result_s3_object_id)
    WHERE result_s3_object_id IS NOT NULL;

ALTER TABLE arm.stored_file
    ADD CONSTRAINT stored_file_current_job_fkey
    FOREIGN KEY (current_recognition_job_id, id)
    REFERENCES arm.recognition_job (id, file_id);

-- Every retry, written in the same transaction as the retry itself (R-RT-3).
CREATE TABLE arm.retry_audit (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    file_id      uuid NOT NULL REFERENCES arm.stored_file (id),
    old_job_id   uuid NOT NULL REFERENCES arm.recognition_job (id),
    new_job_id   uuid NOT NULL UNIQUE REFERENCES arm.recognition_job (id),
    new_attempt  integer NOT NULL,
    actor        text NOT NULL CHECK (actor <> ''),
    retried_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX retry_audit_file_idx ON arm.retry_audit (file_id, retried_at);

-- Periodic tasks that a DBA can read and change with SQL (R-TO-1 scheduling).
-- arm.run_due_tasks() runs whatever is due; the bridge calls it every second or so,
-- and pg_cron may call it where that extension is installed.
CREATE TABLE arm.periodic_task (
    name             text PRIMARY KEY,
    function_name    regprocedure NOT NULL,
    run_every        interval NOT NULL CHECK (run_every >= interval '1 second'),
    enabled          boolean NOT NULL DEFAULT true,
    next_run_at      timestamptz NOT NULL DEFAULT now(),
    last_started_at  timestamptz,
    last_finished_at timestamptz,
    last_result      text,
    last_error       text,
    run_count        bigint NOT NULL DEFAULT 0
);
