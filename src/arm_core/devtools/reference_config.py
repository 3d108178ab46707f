"""The configuration of a reference recognition service (:mod:`arm_core.devtools.reference`):
:class:`ReferenceConfig`, read from the REFERENCE_* variables as Settings is (both
arm_core.config.EnvSettings), and the names it is made of: the services (TABULAR, SCAN) and
their pipelines and request subjects, the modes and the per-file markers that make a
service misbehave on purpose.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, model_validator

from arm_core.bridge.contracts import RESULT_SCHEMA, schema
from arm_core.config import EnvSettings, Settings, number, one_of, parsed
from arm_core.config_error import ConfigError

TABULAR = "tabular-parser"
SCAN = "scan-gateway"
MODES = ("normal", "fail", "never_ack", "never_answer")
PIPELINES = {TABULAR: "tabular", SCAN: "image"}
DEFAULT_SUBJECTS = {TABULAR: "files.tabular_uploaded", SCAN: "files.img_uploaded"}
MARKERS = (("[noack]", "never_ack"), ("[silent]", "never_answer"), ("[fail]", "fail"))
# Fails the first attempt only: what a retry recovers.
FAIL_ONCE = "[fail-once]"


# The `error.code` values the result schema allows.
ERROR_CODES = tuple(schema(RESULT_SCHEMA)["properties"]["error"]["properties"]["code"]["enum"])


def _bucket(raw: str) -> str:
    value = raw.strip()
    if len(value) > 63 or any(c.isspace() or c == "/" for c in value):
        raise ValueError(f"not an S3 bucket name: {raw!r}")
    return value


class ReferenceConfig(EnvSettings):
    """One service's configuration: its REFERENCE_* variables (read by from_env, as
    Settings' are) and the subjects it serves (from Settings)."""

    service: str  # tabular-parser | scan-gateway
    version: str = "0.1.0-reference"
    mode: Annotated[str, parsed(one_of(MODES))] = Field(
        "normal",
        alias="REFERENCE_MODE",
        description=f"how the services answer: {' · '.join(f'`{m}`' for m in MODES)}; "
        f"{', '.join(f'`{marker}`' for marker, _ in MARKERS)} in a file's name overrides it "
        f"for that file ({', '.join(f'`{mode}`' for _, mode in MARKERS)}); `{FAIL_ONCE}` "
        "fails its first attempt only",
    )
    delay_seconds: Annotated[float, parsed(number(float, 0))] = Field(
        0.5, alias="REFERENCE_DELAY_SECONDS"
    )
    """between the ack and the result ("reading S3, recognising"): a worker's time per file"""
    workers: Annotated[int | None, parsed(number(int, 1))] = Field(None, alias="REFERENCE_WORKERS")
    """files worked on at once, the service's capacity; the others wait in its own queue (unset:
    every file at once)"""
    ack: Annotated[str, parsed(one_of(("receipt", "start")))] = Field(
        "receipt", alias="REFERENCE_ACK"
    )
    """`receipt`: acks a request when it arrives, as the contract asks · `start`: when a worker
    starts on it, as a pull-based pool does (with REFERENCE_WORKERS)"""
    fail_code: Annotated[str, parsed(one_of(ERROR_CODES, str.upper))] = Field(
        "UNSUPPORTED_FORMAT", alias="REFERENCE_FAIL_CODE"
    )
    """`error.code` in mode `fail` and for `[fail]` files (a code of the result schema)"""
    results_dir: Annotated[Path, parsed(lambda raw: Path(raw.strip()))] = Field(
        Path(".dev/results"), alias="REFERENCE_RESULTS_DIR"
    )
    """where the `result.json` files go: the local stand-in for the results bucket"""
    results_bucket: Annotated[str, parsed(_bucket)] = Field(
        "arm-ka", alias="REFERENCE_RESULTS_BUCKET"
    )
    """the bucket named in each result's `result_s3`"""
    pending_max: Annotated[int, parsed(number(int, 1))] = Field(5000, alias="REFERENCE_PENDING_MAX")
    """answers kept while NATS is unreachable; when full the oldest is dropped (a `WARNING`,
    `action=ref_pending_drop`, counted; see [For service
    teams](service-teams.md#for-service-teams))"""
    publish: Annotated[str, parsed(one_of(("auto", "core")))] = Field(
        "auto", alias="REFERENCE_PUBLISH"
    )
    """`auto`: answers through JetStream publish (waiting for the PubAck) where a stream captures
    the result subject, else core NATS · `core`: always core NATS, as a service that has not
    adopted JetStream publish (`make chaos` measures what it loses)"""
    request_subject: str | None = None  # default by service
    result_subject: str = "files.tabular_parsed"
    queue_group: str | None = None  # default: the service name

    def __init__(self, service: str | None = None, /, **values: Any) -> None:
        """ReferenceConfig(TABULAR, delay_seconds=…): the service first."""
        if service is not None:
            values["service"] = service
        super().__init__(**values)

    @model_validator(mode="after")
    def _known(self) -> ReferenceConfig:
        if self.service not in PIPELINES:
            raise ValueError(f"service: expected {TABULAR} or {SCAN}, got {self.service!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        return self

    @classmethod
    def from_env(cls, service: str, environ: Mapping[str, str] | None = None) -> ReferenceConfig:
        """REFERENCE_MODE, _DELAY_SECONDS, _WORKERS, _ACK, _FAIL_CODE, _RESULTS_DIR,
        _RESULTS_BUCKET, _PENDING_MAX, _PUBLISH of `environ` (os.environ by default)."""
        if service not in PIPELINES:
            raise ConfigError(f"REFERENCE_SERVICES: expected {TABULAR} or {SCAN}, got {service!r}")
        return cls._read(environ, service=service)

    @property
    def subject(self) -> str:
        return self.request_subject or DEFAULT_SUBJECTS[self.service]

    @property
    def queue(self) -> str:
        return self.queue_group or self.service


def configs_from_env(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> list[ReferenceConfig]:
    """REFERENCE_SERVICES (default both), each with its pipeline's request subject and the
    result subject from Settings, and the REFERENCE_* variables of `environ`."""
    env = os.environ if environ is None else environ
    raw = env.get("REFERENCE_SERVICES", "").strip() or f"{TABULAR},{SCAN}"
    names = list(dict.fromkeys(name.strip() for name in raw.split(",") if name.strip()))
    if not names:
        raise ConfigError(
            f"REFERENCE_SERVICES: expected {TABULAR}, {SCAN} or both (comma-separated), got {raw!r}"
        )
    configs = []
    for name in names:
        config = ReferenceConfig.from_env(name, env)
        subject = getattr(settings, f"{PIPELINES[name]}_request_subject")
        changes = {"request_subject": subject, "result_subject": settings.result_subject}
        configs.append(config.model_copy(update=changes))
    return configs
