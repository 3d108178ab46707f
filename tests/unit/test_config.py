"""Configuration parsing (SPEC §12): defaults, and a start-up error naming the variable."""

from __future__ import annotations

import pytest

from arm_core.config import ConfigError, Settings


def test_defaults_are_the_specs() -> None:
    s = Settings.from_env({})
    assert s.database_url is None
    assert s.nats_urls == ("nats://127.0.0.1:4222",)
    assert s.nats_enabled is True and s.debug is False
    assert (s.nats_seed, s.nats_jwt) == ("", "")
    assert s.outbox_poll_seconds == 5
    assert s.ack_timeout_seconds == 30
    assert s.outbox_max_republish == 3
    assert s.timeout_sweep_seconds == 30
    assert (s.tabular_reply_timeout_seconds, s.image_reply_timeout_seconds) == (600, 1800)
    assert s.default_max_attempts == 3
    assert (s.http_host, s.http_port) == ("127.0.0.1", 8080)
    assert s.subject_for("tabular") == "files.tabular_uploaded"
    assert s.subject_for("image") == "files.img_uploaded"
    assert s.result_subject == "files.tabular_parsed"
    assert s.nats_queue_group == "arm-core"
    assert s.explicit == frozenset()


def test_values_are_parsed_and_remembered_as_given() -> None:
    s = Settings.from_env(
        {
            "DATABASE_URL": "postgresql://u@db:5432/arm",
            "NATS_URL": "nats://a:4222, nats://b:4222",
            "NATS_ENABLED": "false",
            "DEBUG": "TRUE",
            "OUTBOX_MAX_REPUBLISH": "0",
            "ACK_TIMEOUT_SECONDS": "0.5",
            "HTTP_PORT": "0",
        }
    )
    assert s.database_url == "postgresql://u@db:5432/arm"
    assert s.nats_urls == ("nats://a:4222", "nats://b:4222")
    assert s.nats_enabled is False and s.debug is True
    assert s.outbox_max_republish == 0
    assert s.ack_timeout_seconds == 0.5
    assert s.http_port == 0
    assert "OUTBOX_MAX_REPUBLISH" in s.explicit and "TIMEOUT_SWEEP_SECONDS" not in s.explicit


def test_empty_credentials_mean_none() -> None:
    s = Settings.from_env({"OPENBAO__NATS__NATS_SEED": "", "OPENBAO__NATS__NATS_JWT": "  "})
    assert (s.nats_seed, s.nats_jwt) == ("", "")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "mysql://x"),
        ("NATS_URL", "http://x:4222"),
        ("NATS_URL", "nats://x:99999"),
        ("NATS_URL", " , "),
        ("NATS_ENABLED", "maybe"),
        ("DEBUG", "2"),
        ("OUTBOX_POLL_SECONDS", "0"),
        ("OUTBOX_POLL_SECONDS", "soon"),
        ("OUTBOX_POLL_SECONDS", "nan"),
        ("ACK_TIMEOUT_SECONDS", "inf"),
        ("ACK_TIMEOUT_SECONDS", "-1"),
        ("OUTBOX_MAX_REPUBLISH", "1.5"),
        ("OUTBOX_MAX_REPUBLISH", "-1"),
        ("TIMEOUT_SWEEP_SECONDS", "0.2"),
        ("TABULAR_REPLY_TIMEOUT_SECONDS", "x"),
        ("IMAGE_REPLY_TIMEOUT_SECONDS", "0"),
        ("DEFAULT_MAX_ATTEMPTS", "0"),
        ("HTTP_PORT", "70000"),
        ("HTTP_PORT", "http"),
        ("RESULT_SUBJECT", "files tabular"),
    ],
)
def test_a_bad_value_fails_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^{name}: "):
        Settings.from_env({name: value})


def test_database_url_is_required_where_needed() -> None:
    with pytest.raises(ConfigError, match=r"^DATABASE_URL: required"):
        Settings.from_env({}).require_database_url()


def test_auth_settings() -> None:
    s = Settings.from_env(
        {"AUTH_MODE": "token", "API_TOKENS": "ivanova=0123456789abcdef, ops=fedcba9876543210"}
    )
    assert s.api_tokens == (("ivanova", "0123456789abcdef"), ("ops", "fedcba9876543210"))
    with pytest.raises(ConfigError, match=r"^API_TOKENS: required when AUTH_MODE=token"):
        Settings.from_env({"AUTH_MODE": "token"})
    with pytest.raises(ConfigError, match=r"^API_TOKENS: expected actor=token"):
        Settings.from_env({"API_TOKENS": "ivanova=short"})
    with pytest.raises(ConfigError, match=r"^AUTH_MODE: expected one of"):
        Settings.from_env({"AUTH_MODE": "ldap"})
    with pytest.raises(ConfigError, match=r"^AUTH_HEADER: not an HTTP header"):
        Settings.from_env({"AUTH_HEADER": "X User"})
