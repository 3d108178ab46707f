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


TABULAR_TYPES = frozenset({FileType.XLS, FileType.XLSX, FileType.XLSB})


def pipeline_for(file_type: str) -> Pipeline:
    """The pipeline a file type goes to: spreadsheets to tabular, scans to image (the
    same rule as arm.pipeline_for; tests/integration/test_schema.py checks they agree)."""
    return Pipeline.TABULAR if FileType(file_type) in TABULAR_TYPES else Pipeline.IMAGE


class BucketRole(StrEnum):
    UPLOADS = "uploads"
    RESULTS = "results"
    RAW = "raw"


# The database enum each Python enum mirrors.
DB_ENUMS: dict[str, type[StrEnum]] = {
    "arm.job_status": JobStatus,
    "arm.file_status": FileStatus,
    "arm.pipeline": Pipeline,
    "arm.file_type": FileType,
    "arm.bucket_role": BucketRole,
}
