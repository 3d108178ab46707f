"""Configuration parsing (docs/behaviour.md#configuration): defaults, and a start-up error
naming the variable."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import nkeys
import pytest

from arm_core.access import ApiToken, Level
from arm_core.config import POOL_RESERVE, Settings
from arm_core.config_error import ConfigError
from arm_core.redaction import mask_url, mask_urls_in
from tests.support.natsauth import operator_mode


def test_defaults_are_the_specs() -> None:
    s = Settings.from_env({})
    assert s.database_url is None
    assert s.nats_urls == ("nats://127.0.0.1:4222",)
    assert s.nats_enabled is True and s.debug is False
    assert (s.nats_seed.get_secret_value(), s.nats_jwt.get_secret_value()) == ("", "")
    assert s.outbox_poll_seconds == 5
    assert s.ack_timeout_seconds == 30
    assert s.outbox_max_republish == 3
    assert s.timeout_sweep_seconds == 30
    assert (s.tabular_reply_timeout_seconds, s.image_reply_timeout_seconds) == (600, 1800)
    assert s.default_max_attempts == 3
    assert (s.http_host, s.http_port) == ("127.0.0.1", 8080)
    assert s.tabular_request_subject == "files.tabular_uploaded"
    assert s.image_request_subject == "files.img_uploaded"
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
    assert (s.nats_seed.get_secret_value(), s.nats_jwt.get_secret_value()) == ("", "")


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


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://arm@db1:5432,db2:5432/arm?target_session_attrs=read-write",
        "postgres://arm@[::1]:5432,db2/arm",
        "host=db1,db2 port=5432,5433 dbname=arm user=arm target_session_attrs=read-write",
        "host=db1 dbname=arm password='Pw9x Q2vL7k'",
    ],
)
def test_database_url_takes_what_libpq_takes(url: str) -> None:
    """Several hosts for a primary and its standbys, and libpq's key=value form: every
    command takes DATABASE_URL as libpq does (a failover setup needs the first)."""
    s = Settings.from_env({"DATABASE_URL": url})
    assert s.require_database_url() == url
    assert no_part_of("Pw9xQ2vL7k", repr(s)), repr(s)


def test_database_url_is_required_where_needed() -> None:
    with pytest.raises(ConfigError, match=r"^DATABASE_URL: required"):
        Settings.from_env({}).require_database_url()


def test_auth_settings() -> None:
    s = Settings.from_env(
        {"AUTH_MODE": "token", "API_TOKENS": "ivanova=0123456789abcdef, ops=fedcba9876543210"}
    )
    assert s.api_tokens == (
        ApiToken("ivanova", "0123456789abcdef", None),
        ApiToken("ops", "fedcba9876543210", None),
    )
    assert s.unlevelled_tokens() == s.api_tokens
    with pytest.raises(ConfigError, match=r"^API_TOKENS: required when AUTH_MODE=token"):
        Settings.from_env({"AUTH_MODE": "token"})
    with pytest.raises(ConfigError, match=r"^API_TOKENS: entry 1 of 1: the token is shorter"):
        Settings.from_env({"API_TOKENS": "ivanova=short"})
    with pytest.raises(ConfigError, match=r"^AUTH_MODE: expected one of"):
        Settings.from_env({"AUTH_MODE": "ldap"})
    with pytest.raises(ConfigError, match=r"^AUTH_HEADER: not an HTTP header"):
        Settings.from_env({"AUTH_HEADER": "X User"})


# --- secrets never shown ------------------------------------------


def no_part_of(secret: str, text: str, width: int = 5) -> bool:
    """Whether `text` holds no run of `width` characters of `secret`."""
    return all(secret[i : i + width] not in text for i in range(len(secret) - width + 1))


def error_of(env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    return str(caught.value)


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("DATABASE_URL", "mysql://admin:Pw9xQ2vL7k@db.example/arm", "mysql://admin:***@db.example"),
        ("DATABASE_URL", "admin:Pw9xQ2vL7k@db.example/arm", "admin:***@db.example/arm"),
        ("DATABASE_URL", "admin:Pw9xQ2vL7k@db/arm?sslmode=require", "admin:***@db/arm"),
        ("DATABASE_URL", "host=db user=admin password=Pw9xQ2vL7k oops", "password=***"),
        # libpq's parser quotes what it cannot read, here the password itself
        ("DATABASE_URL", "postgresql://admin:Pw9x Q2vL7k@db/arm", 'spaces found in "***"'),
        ("DATABASE_URL", "postgresql://admin:Pw9x%zzQ2vL7k@db/arm", "percent-encoded token"),
        ("DATABASE_URL", "postgresql://admin:Pw9xQ2vL7k@[::1/arm", "admin:***@[::1/arm"),
        ("NATS_URL", "http://arm:Pw9xQ2vL7k@nats:4222", "http://arm:***@nats:4222"),
        ("NATS_URL", "nats://arm:Pw9xQ2vL7k@nats:99999", "nats://arm:***@nats:99999"),
        ("NATS_URL", "nats://Pw9xQ2vL7k@nats:99999", "nats://***@nats:99999"),  # a token
        ("API_TOKENS", "ivanova=Pw9xQ2vL7k", "entry 1 of 1: the token is shorter"),
        (
            "API_TOKENS",
            "ops=abcdefghijklmnop0,Pw9xQ2vL7kZZZZZZZZ",
            "entry 2 of 2: expected actor:level=token",
        ),
        ("API_TOKENS", "=Pw9xQ2vL7kZZZZZZZZ", "the actor is empty"),
    ],
)
def test_a_secret_in_a_bad_value_is_never_shown(name: str, value: str, shown: str) -> None:
    message = error_of({name: value})
    assert message.startswith(f"{name}: ") and shown in message, message
    assert no_part_of("Pw9xQ2vL7k", message), message


def test_each_token_names_its_level() -> None:
    s = Settings.from_env(
        {
            "AUTH_MODE": "token",
            "API_TOKENS": "ivanova:viewer=0123456789abcdef, ops : operator = fedcba9876543210,"
            "prometheus:metrics=abcdefabcdef0123,old=0000000000000000",
        }
    )
    assert s.api_tokens == (
        ApiToken("ivanova", "0123456789abcdef", Level.VIEWER),
        ApiToken("ops", "fedcba9876543210", Level.OPERATOR),
        ApiToken("prometheus", "abcdefabcdef0123", Level.METRICS),
        ApiToken("old", "0000000000000000", None),
    )
    assert s.unlevelled_tokens() == (ApiToken("old", "0000000000000000", None),)
    assert "0123456789abcdef" in s.secrets() and "0123456789abcdef" not in repr(s)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"API_TOKENS": "ivanova:admin=Pw9xQ2vL7kZZZZZZZZ"},
            "API_TOKENS: entry 1 of 1: the access level after ':' is not one of viewer, "
            "operator, metrics",
        ),
        (
            {"API_TOKENS": "ivanova:Pw9xQ2vL7k=0123456789abcdef"},
            "API_TOKENS: entry 1 of 1: the access level after ':' is not one of",
        ),
        (
            {"API_TOKENS": "a:viewer=Pw9xQ2vL7kZZZZZZZZ,b:operator=Pw9xQ2vL7kZZZZZZZZ"},
            "API_TOKENS: entry 2 of 2: the same token as entry 1, with another level "
            "(operator and viewer); the audit could not tell who",
        ),
        (
            {"AUTH_MODE": "header", "AUTH_OPERATOR_GROUPS": "arm-operators"},
            "AUTH_OPERATOR_GROUPS: needs AUTH_GROUPS_HEADER",
        ),
        (
            {"AUTH_MODE": "header", "AUTH_VIEWER_GROUPS": "support"},
            "AUTH_VIEWER_GROUPS: needs AUTH_GROUPS_HEADER",
        ),
        (
            {"AUTH_MODE": "header", "AUTH_GROUPS_HEADER": "X-Forwarded-Groups"},
            "AUTH_GROUPS_HEADER: set, but AUTH_OPERATOR_GROUPS, AUTH_VIEWER_GROUPS and "
            "AUTH_METRICS_GROUPS are all empty",
        ),
        (
            {
                "AUTH_MODE": "token",
                "API_TOKENS": "a=0123456789abcdef",
                "AUTH_GROUPS_HEADER": "X-Forwarded-Groups",
                "AUTH_VIEWER_GROUPS": "x",
            },
            "AUTH_GROUPS_HEADER: only for AUTH_MODE=header (AUTH_MODE=token)",
        ),
        (
            {
                "AUTH_MODE": "header",
                "AUTH_GROUPS_HEADER": "X-Forwarded-User",
                "AUTH_VIEWER_GROUPS": "x",
            },
            "AUTH_GROUPS_HEADER: the same header as AUTH_HEADER",
        ),
        ({"AUTH_GROUPS_HEADER": "X Groups"}, "AUTH_GROUPS_HEADER: not an HTTP header name"),
        ({"METRICS_AUTH": "open"}, "METRICS_AUTH: expected one of"),
    ],
)
def test_a_bad_access_setting_names_its_variable_and_no_token(
    env: dict[str, str], message: str
) -> None:
    shown = error_of(env)
    assert shown.startswith(message), shown
    assert no_part_of("Pw9xQ2vL7k", shown), shown


def test_header_mode_with_groups() -> None:
    s = Settings.from_env(
        {
            "AUTH_MODE": "header",
            "AUTH_GROUPS_HEADER": "X-Forwarded-Groups",
            "AUTH_OPERATOR_GROUPS": "arm-operators",
            "AUTH_VIEWER_GROUPS": " support , auditors ,",
        }
    )
    assert s.auth_viewer_groups == {"support", "auditors"}
    assert s.auth_metrics_groups == frozenset() and s.metrics_auth == "level"


def test_two_actors_with_one_token_are_refused_without_showing_it() -> None:
    token = "Pw9xQ2vL7kZZZZZZZZ"
    message = error_of({"API_TOKENS": f"a={token},b=0123456789abcdef,c={token}"})
    assert message.startswith("API_TOKENS: entry 3 of 3: the same token as entry 1")
    assert no_part_of(token, message)


def test_url_masking_keeps_user_host_and_database() -> None:
    assert (
        mask_url("postgresql://admin:S3cretPW@db:5432/arm") == "postgresql://admin:***@db:5432/arm"
    )
    assert mask_url("postgresql://admin@db/arm") == "postgresql://admin@db/arm"
    assert mask_url("postgresql://db/arm?user=a&password=S3cretPW") == (
        "postgresql://db/arm?user=a&password=***"
    )
    assert mask_url("postgresql://admin:p@ss/w@rd@db/arm") == "postgresql://admin:***@db/arm"
    assert mask_url("nats://tok3n@nats:4222", bare_user_is_secret=True) == "nats://***@nats:4222"
    assert mask_url("nats://nats:4222", bare_user_is_secret=True) == "nats://nats:4222"
    said = 'bad "postgresql://admin:S3cretPW@db/arm" and password=S3cretPW here'
    assert mask_urls_in(said) == 'bad "postgresql://admin:***@db/arm" and password=*** here'


def user_seed() -> str:
    return nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()


def _flip(seed: str, at: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    other = alphabet[(alphabet.index(seed[at]) + 1) % 32]
    return seed[:at] + other + seed[at + 1 :]


GOOD_SEED = user_seed()
# Two neighbouring characters that differ (the seed is random: a swap of two equal ones
# would leave it valid, about one run in 32).
_AT = next(i for i in range(30, 56) if GOOD_SEED[i] != GOOD_SEED[i + 1])


@pytest.mark.parametrize(
    ("seed", "why"),
    [
        ("SUAMXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX", "a user seed has 58 characters, this has 36"),
        (GOOD_SEED[:-1], "58 characters, this has 57"),
        (GOOD_SEED + "A", "58 characters, this has 59"),
        (_flip(GOOD_SEED, 20), "checksum does not match"),
        (GOOD_SEED[:_AT] + GOOD_SEED[_AT + 1] + GOOD_SEED[_AT] + GOOD_SEED[_AT + 2 :], "checksum"),
        (_flip(GOOD_SEED, 57), "checksum does not match"),  # only base32's unused bits
        (GOOD_SEED[:10] + "1" + GOOD_SEED[11:], "not base32"),
        (GOOD_SEED.lower(), "starts with S"),
        (nkeys.from_seed(GOOD_SEED.encode()).public_key.decode() + "AA", "starts with S"),
        (nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT).decode(), "an account seed"),
        (nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_OPERATOR).decode(), "an operator"),
        (operator_mode().user_jwt, "looks like a JWT"),
    ],
    ids=lambda value: None if " " in value or len(value) < 20 else "seed",  # not the seed itself
)
def test_a_seed_that_cannot_work_fails_at_start_quoting_none_of_it(seed: str, why: str) -> None:
    message = error_of({"OPENBAO__NATS__NATS_SEED": seed})
    assert message.startswith("OPENBAO__NATS__NATS_SEED: not a valid nkey seed ("), message
    assert why in message
    assert no_part_of(seed, message), message


def _b64(value: object) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    ("jwt", "why"),
    [
        ("eyJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJzdWIiOiJVIn0", "three base64url parts"),
        ("a.b.c.d", "three base64url parts"),
        (f"{_b64({'alg': 'x'})}.{_b64({'sub': 'U'})}.", "three base64url parts"),
        (f"{_b64({'alg': 'x'})}.{_b64({'sub': 'U'})}.si+g/", "three base64url parts"),
        (f"{_b64(b'not json')}.{_b64({'sub': 'U'})}.c2ln", "its header is not"),
        (f"{_b64({'alg': 'x'})}.{_b64(['a list'])}.c2ln", "its payload is not"),
        (f"{_b64({'alg': 'x'})}.{_b64(b'{broken')}.c2ln", "its payload is not"),
    ],
    ids=lambda value: None if " " in value else "jwt",
)
def test_a_malformed_jwt_fails_at_start_quoting_none_of_it(jwt: str, why: str) -> None:
    message = error_of({"OPENBAO__NATS__NATS_SEED": GOOD_SEED, "OPENBAO__NATS__NATS_JWT": jwt})
    assert message.startswith("OPENBAO__NATS__NATS_JWT: not a JWT ("), message
    assert why in message
    assert no_part_of(jwt, message, width=8) and no_part_of(GOOD_SEED, message)


def test_nats_credentials_are_checked_together() -> None:
    creds = operator_mode()
    s = Settings.from_env(
        {"OPENBAO__NATS__NATS_SEED": creds.user_seed, "OPENBAO__NATS__NATS_JWT": creds.user_jwt}
    )
    assert (s.nats_seed.get_secret_value(), s.nats_jwt.get_secret_value()) == (
        creds.user_seed,
        creds.user_jwt,
    )
    seed = Settings.from_env({"OPENBAO__NATS__NATS_SEED": f"  {GOOD_SEED}\n"}).nats_seed
    assert seed.get_secret_value() == GOOD_SEED
    message = error_of({"OPENBAO__NATS__NATS_JWT": creds.user_jwt})
    assert message.startswith("OPENBAO__NATS__NATS_SEED: required when OPENBAO__NATS__NATS_JWT")
    # a JWT issued to another user than the seed's key can never authenticate
    message = error_of(
        {"OPENBAO__NATS__NATS_SEED": GOOD_SEED, "OPENBAO__NATS__NATS_JWT": creds.user_jwt}
    )
    assert message.startswith("OPENBAO__NATS__NATS_JWT: issued to another user")
    assert no_part_of(creds.user_jwt, message, 8) and no_part_of(GOOD_SEED, message)


def test_mixing_websocket_and_nats_urls_fails_at_start() -> None:
    assert error_of({"NATS_URL": "nats://a:4222,wss://b:443"}).startswith("NATS_URL: websocket")


def test_repr_and_secrets_hide_and_list_every_secret() -> None:
    creds = operator_mode()
    s = Settings.from_env(
        {
            "DATABASE_URL": "postgresql://admin:Db%2Fpw9xQ2@db/arm?sslpassword=SslPw9xQ2",
            "NATS_URL": "nats://arm:NatsPw9xQ2@a:4222,nats://NatsTok9xQ2@b:4222",
            "OPENBAO__NATS__NATS_SEED": creds.user_seed,
            "OPENBAO__NATS__NATS_JWT": creds.user_jwt,
            "API_TOKENS": "ivanova=Tok9xQ2Zr8mW4pK0",
        }
    )
    secrets = ["Db%2Fpw9xQ2", "Db/pw9xQ2", "SslPw9xQ2", "NatsPw9xQ2", "NatsTok9xQ2"]
    secrets += [creds.user_seed, creds.user_jwt, "Tok9xQ2Zr8mW4pK0"]
    assert set(secrets) <= set(s.secrets())
    shown = repr(s)
    assert all(no_part_of(secret, shown, 6) for secret in secrets), shown
    assert "postgresql://admin:***@db/arm?sslpassword=***" in shown
    assert "nats://arm:***@a:4222" in shown and "nats://***@b:4222" in shown
    assert (
        "api_tokens=(ApiToken(actor='ivanova', token='***', level=None),)" in shown
        and "nats_seed='***'" in shown
    )
    assert "auth_mode='none'" in shown  # the rest as a dataclass shows it
    assert Settings().secrets() == ()


# --- safe by default on the network ---------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "localhost", "::1", "[::1]"])
def test_anonymous_access_on_loopback_needs_nothing(host: str) -> None:
    Settings.from_env({"HTTP_HOST": host}).require_safe_exposure()


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "10.1.2.3", "api.internal"])
def test_anonymous_access_from_the_network_must_be_asked_for(host: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"HTTP_HOST": host}).require_safe_exposure()
    message = str(caught.value)
    assert message.startswith("HTTP_HOST: ")
    assert "AUTH_MODE=none" in message and "AUTH_ALLOW_ANONYMOUS=true" in message
    Settings.from_env({"HTTP_HOST": host, "AUTH_ALLOW_ANONYMOUS": "true"}).require_safe_exposure()
    Settings.from_env({"HTTP_HOST": host, "AUTH_MODE": "header"}).require_safe_exposure()
    Settings.from_env(
        {"HTTP_HOST": host, "AUTH_MODE": "token", "API_TOKENS": "ops=0123456789abcdef"}
    ).require_safe_exposure()


def test_the_pool_holds_the_bridges_loops_and_a_reserve_by_default() -> None:
    """Unset DATABASE_POOL_MAX_SIZE: a connection per publisher and per inbox worker, one
    for the schedule runner, and POOL_RESERVE for the API, health checks and scrapes."""
    assert POOL_RESERVE == 4
    assert Settings.from_env({}).pool_max_size() == 9  # 2 publishers + 2 workers + 1 + 4
    grown = Settings.from_env({"OUTBOX_PUBLISHERS": "5", "INBOX_WORKERS": "3"})
    assert grown.pool_max_size() == 5 + 3 + 1 + POOL_RESERVE
    assert Settings.from_env({"INBOX_WORKERS": "1"}).pool_max_size() == 2 + 1 + 1 + 4
    # No bridge in the process: the reserve alone, whatever the bridge's settings say.
    off = Settings.from_env({"NATS_ENABLED": "false", "OUTBOX_PUBLISHERS": "8"})
    assert off.pool_max_size() == POOL_RESERVE


def test_an_explicit_pool_size_is_taken_when_it_leaves_the_api_a_connection() -> None:
    assert Settings.from_env({"DATABASE_POOL_MAX_SIZE": "6"}).pool_max_size() == 6
    assert Settings.from_env({"DATABASE_POOL_MAX_SIZE": "40"}).pool_max_size() == 40
    off = {"NATS_ENABLED": "false", "DATABASE_POOL_MAX_SIZE": "1"}
    assert Settings.from_env(off).pool_max_size() == 1


@pytest.mark.parametrize(
    ("env", "minimum"),
    [
        ({"DATABASE_POOL_MAX_SIZE": "5"}, 6),
        ({"DATABASE_POOL_MAX_SIZE": "9", "OUTBOX_PUBLISHERS": "4", "INBOX_WORKERS": "4"}, 10),
    ],
)
def test_a_pool_too_small_for_the_bridges_loops_fails_at_start(
    env: dict[str, str], minimum: int
) -> None:
    with pytest.raises(ConfigError, match=r"^DATABASE_POOL_MAX_SIZE: ") as caught:
        Settings.from_env(env)
    said = str(caught.value)
    assert f"at least {minimum}" in said and "the API" in said
    assert f"OUTBOX_PUBLISHERS={env.get('OUTBOX_PUBLISHERS', '2')}" in said


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "many"])
def test_a_pool_size_that_is_no_count_fails_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^DATABASE_POOL_MAX_SIZE: "):
        Settings.from_env({"NATS_ENABLED": "false", "DATABASE_POOL_MAX_SIZE": value})


def test_arm_core_exits_2_naming_a_pool_too_small() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "OUTBOX_"))},
        "DATABASE_URL": "postgresql://arm@127.0.0.1:1/arm",
        "DATABASE_POOL_MAX_SIZE": "3",
    }
    arm_core = str(Path(sys.executable).with_name("arm-core"))
    done = subprocess.run([arm_core, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "DATABASE_POOL_MAX_SIZE: 3 is too small: at least 6" in done.stderr


def test_the_idle_in_transaction_timeout_is_0_or_above_the_publishers_wait() -> None:
    assert Settings.from_env({}).db_idle_in_transaction_timeout_seconds == 20
    variable = "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS"
    assert Settings.from_env({variable: "0"}).db_idle_in_transaction_timeout_seconds == 0
    assert Settings.from_env({variable: "45"}).db_idle_in_transaction_timeout_seconds == 45
    for value in ("10", "0.5", "-1", "soon", "3000000"):
        with pytest.raises(ConfigError, match=rf"^{variable}: "):
            Settings.from_env({variable: value})
    with pytest.raises(ConfigError, match="more than 10 s, the publisher's wait"):
        Settings.from_env({variable: "5"})
