"""The configuration of a reference recognition service (:mod:`arm_core.devtools.reference`):
:class:`ReferenceConfig`, read from the REFERENCE_* variables by config.read_env (the
parser of Settings too), and the names it is made of: the services (TABULAR, SCAN) and
their pipelines and request subjects, the modes and the per-file markers that make a
service misbehave on purpose.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from arm_core.bridge.contracts import RESULT_SCHEMA, schema
from arm_core.config import Settings
from arm_core.config_env import env_var, number, one_of, read_env
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


def _path(name: str, raw: str) -> Path:
    return Path(raw.strip())


def _bucket(name: str, raw: str) -> str:
    value = raw.strip()
    if len(value) > 63 or any(c.isspace() or c == "/" for c in value):
        raise ConfigError(f"{name}: not an S3 bucket name: {raw!r}")
    return value


@dataclass(frozen=True)
class ReferenceConfig:
    """One service's configuration; REFERENCE_* variables are read by config.read_env,
    the parser of Settings too."""

    service: str  # tabular-parser | scan-gateway
    version: str = "0.1.0-reference"
    # normal | fail | never_ack | never_answer
    mode: str = env_var("REFERENCE_MODE", one_of(MODES), "normal")
    # Between the ack and the result ("reading S3, recognising"): a worker's time per file.
    delay_seconds: float = env_var("REFERENCE_DELAY_SECONDS", number(float, 0), 0.5)
    # The service's capacity: files worked on at once; the others wait in its own queue,
    # acked (REFERENCE_ACK=receipt) or not yet (start). None: no limit, every file at once.
    workers: int | None = env_var("REFERENCE_WORKERS", number(int, 1), None)
    # When a request is acked: on receipt, as the contract asks; or when a worker starts
    # on it, as a pull-based pool does (its acks come late when its queue is long).
    ack: str = env_var("REFERENCE_ACK", one_of(("receipt", "start")), "receipt")
    # error.code in mode fail and for "[fail]" files.
    fail_code: str = env_var(
        "REFERENCE_FAIL_CODE", one_of(ERROR_CODES, str.upper), "UNSUPPORTED_FORMAT"
    )
    # The local stand-in for the results bucket.
    results_dir: Path = env_var("REFERENCE_RESULTS_DIR", _path, Path(".dev/results"))
    results_bucket: str = env_var("REFERENCE_RESULTS_BUCKET", _bucket, "arm-ka")
    # Answers kept while NATS is unreachable; when full the oldest is dropped (logged).
    pending_max: int = env_var("REFERENCE_PENDING_MAX", number(int, 1), 5000)
    # auto: JetStream publish where a stream captures the result subject, else core NATS;
    # core: always core NATS, as a service that has not adopted JetStream publish (make
    # chaos measures what such a service loses).
    publish: str = env_var("REFERENCE_PUBLISH", one_of(("auto", "core")), "auto")
    request_subject: str | None = None  # default by service
    result_subject: str = "files.tabular_parsed"
    queue_group: str | None = None  # default: the service name

    def __post_init__(self) -> None:
        if self.service not in PIPELINES:
            raise ValueError(f"service: expected {TABULAR} or {SCAN}, got {self.service!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")

    @property
    def subject(self) -> str:
        return self.request_subject or DEFAULT_SUBJECTS[self.service]

    @property
    def queue(self) -> str:
        return self.queue_group or self.service

    @classmethod
    def from_env(cls, service: str, environ: Mapping[str, str] | None = None) -> ReferenceConfig:
        """REFERENCE_MODE, _DELAY_SECONDS, _WORKERS, _ACK, _FAIL_CODE, _RESULTS_DIR,
        _RESULTS_BUCKET, _PENDING_MAX, _PUBLISH."""
        if service not in PIPELINES:
            raise ConfigError(f"REFERENCE_SERVICES: expected {TABULAR} or {SCAN}, got {service!r}")
        values, _given = read_env(cls, os.environ if environ is None else environ)
        return cls(service=service, **values)


def configs_from_env(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> list[ReferenceConfig]:
    """REFERENCE_SERVICES (default both), subjects from Settings, the rest per from_env."""
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
        subject = settings.subject_for(PIPELINES[name])
        configs.append(
            replace(config, request_subject=subject, result_subject=settings.result_subject)
        )
    return configs
