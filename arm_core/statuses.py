"""The names the database's enum types hold, as Python knows them.

tests/integration/test_schema.py checks that these equal the database's enums.
"""

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

    @property
    def is_final(self) -> bool:
        return self in FINAL_JOB_STATUSES


FINAL_JOB_STATUSES = frozenset(
    {JobStatus.DONE, JobStatus.NEEDS_CHECK, JobStatus.ERROR, JobStatus.TIMEOUT, JobStatus.DLQ}
)
RETRYABLE_JOB_STATUSES = frozenset({JobStatus.ERROR, JobStatus.TIMEOUT, JobStatus.DLQ})


class FileStatus(StrEnum):
    UPLOADED = "UPLOADED"
    PROCESSING = "PROCESSING"
    ERROR = "ERROR"


class Pipeline(StrEnum):
    TABULAR = "tabular"
    IMAGE = "image"


class FileType(StrEnum):
    XLS = "XLS"
    XLSX = "XLSX"
    XLSB = "XLSB"
    PDF = "PDF"
    PNG = "PNG"
    JPG = "JPG"


class BucketRole(StrEnum):
    UPLOADS = "uploads"
    RESULTS = "results"
    RAW = "raw"


class Outcome(StrEnum):
    """What a transition function did (db/functions/30_inbox.sql, 50_retry.sql)."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    ALREADY_FINAL = "already_final"
    NOT_PUBLISHED = "not_published"
    UNKNOWN_JOB = "unknown_job"
    FILE_MISMATCH = "file_mismatch"
    RETRIED = "retried"
    NOT_FOUND = "not_found"
    NOT_RETRYABLE = "not_retryable"


# The database enum each Python enum mirrors.
DB_ENUMS: dict[str, type[StrEnum]] = {
    "arm.job_status": JobStatus,
    "arm.file_status": FileStatus,
    "arm.pipeline": Pipeline,
    "arm.file_type": FileType,
    "arm.bucket_role": BucketRole,
}
