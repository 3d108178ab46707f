"""The labels of the database's enum types Python reads, and the outcomes its functions
return (tests/integration/test_schema.py and test_store.py check both against the
database)."""

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    PUBLISHED = "published"
    PROCESSING = "processing"
    DONE = "done"
    NEEDS_CHECK = "needs_check"
    ERROR = "error"
    TIMEOUT = "timeout"
    DLQ = "dlq"


class FileStatus(StrEnum):
    UPLOADED = "UPLOADED"
    PROCESSING = "PROCESSING"
    ERROR = "ERROR"


class FileType(StrEnum):
    XLS = "XLS"
    XLSX = "XLSX"
    XLSB = "XLSB"
    PDF = "PDF"
    PNG = "PNG"
    JPG = "JPG"


class ApplyOutcome(StrEnum):
    """What arm.apply_envelopes_v2 did with an envelope."""

    APPLIED = "applied"
    # A valid envelope with nothing to change:
    DUPLICATE = "duplicate"
    ALREADY_FINAL = "already_final"
    UNKNOWN_JOB = "unknown_job"
    FILE_MISMATCH = "file_mismatch"
    NOT_PUBLISHED = "not_published"
    # apply_envelopes_v2 only: another transaction holds the job; not an outcome yet, the
    # envelope is applied again.
    BUSY = "busy"
    # The inbox's own, never the database's: the database raised on the envelope even
    # when it was applied alone.
    FAILED = "failed"


class PublishOutcome(StrEnum):
    """What arm.publish_queued_jobs_v2 did with a claimed job."""

    PUBLISHED = "published"
    # The request exceeds the server's max_payload: dead-lettered, nothing sent.
    DLQ = "dlq"


class RetryOutcome(StrEnum):
    """What arm.retry_file (and retry_files) did with a file."""

    RETRIED = "retried"
    NOT_FOUND = "not_found"
    NOT_RETRYABLE = "not_retryable"


class RetryReason(StrEnum):
    """Why arm.retry_file did not retry (NULL when it did)."""

    FILE_NOT_FOUND = "file_not_found"
    NO_JOB = "no_job"
    NOT_FAILED = "not_failed"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    ATTEMPT_CHANGED = "attempt_changed"
    ARCHIVED = "archived"
