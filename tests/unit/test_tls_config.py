"""TLS files are start-up configuration (src/arm_core/tls.py): each problem is a
ConfigError naming its variable — and `arm-core` exits 2 with it — without a byte of the
files in the message; the contexts verify server names and speak TLS 1.2 at least; a
DATABASE_URL's TLS parameters show in its masked form, its sslpassword does not."""

from __future__ import annotations

import datetime as dt
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from arm_core.config import Settings
from arm_core.config_error import ConfigError
from arm_core.metrics import certificate_expiries
from arm_core.redaction import mask_url
from tests.support.tls import Pki, assert_no_key_material

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def nats_env(ca: Path | str, cert: Path | str = "", key: Path | str = "") -> dict[str, str]:
    return {
        "NATS_TLS_CA_FILE": str(ca),
        "NATS_TLS_CERT_FILE": str(cert),
        "NATS_TLS_KEY_FILE": str(key),
    }


def test_good_files_make_contexts_that_verify_names_and_speak_tls_1_2_at_least(pki: Pki) -> None:
    client = pki.issue("bridge")
    server = pki.issue("localhost", "localhost", "127.0.0.1")
    settings = Settings.from_env(
        {
            **nats_env(pki.ca_file, client.cert, client.key),
            "HTTP_TLS_CERT_FILE": str(server.cert),
            "HTTP_TLS_KEY_FILE": str(server.key),
        }
    )
    nats = settings.nats_tls_context()
    assert nats is not None
    assert (nats.check_hostname, nats.verify_mode) == (True, ssl.CERT_REQUIRED)
    assert nats.minimum_version == ssl.TLSVersion.TLSv1_2
    https = settings.https_context()
    assert https is not None and https.minimum_version == ssl.TLSVersion.TLSv1_2
    # Nothing configured: no context (plain nats://, plain HTTP).
    assert Settings.from_env({}).nats_tls_context() is None
    assert Settings.from_env({}).https_context() is None
    # A tls:// URL alone: the system's CAs, names still verified.
    tls_url = Settings.from_env({"NATS_URL": "tls://nats.example:4222"}).nats_tls_context()
    assert tls_url is not None and tls_url.check_hostname


def problems(pki: Pki, other: Pki, tmp_path: Path) -> list[tuple[dict[str, str], str, str]]:
    """(environment, the variable the error must name, words it must say)."""
    good = pki.issue("bridge")
    foreign = other.issue("bridge-of-another-ca")
    expired = pki.issue(
        "expired", not_before=NOW - dt.timedelta(days=30), not_after=NOW - dt.timedelta(days=1)
    )
    early = pki.issue(
        "early", not_before=NOW + dt.timedelta(days=1), not_after=NOW + dt.timedelta(days=30)
    )
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    locked = tmp_path / "locked.key"
    key = serialization.load_pem_private_key(good.key.read_bytes(), password=None)
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret-passphrase"),
        )
    )
    missing = tmp_path / "nowhere.crt"
    return [
        (nats_env(missing), "NATS_TLS_CA_FILE", "cannot read"),
        (nats_env(garbage), "NATS_TLS_CA_FILE", "no PEM certificate"),
        (nats_env(pki.ca_file, expired.cert, expired.key), "NATS_TLS_CERT_FILE", "expired on"),
        (nats_env(pki.ca_file, early.cert, early.key), "NATS_TLS_CERT_FILE", "not valid before"),
        (nats_env(pki.ca_file, good.cert, foreign.key), "NATS_TLS_KEY_FILE", "does not match"),
        (nats_env(pki.ca_file, good.cert), "NATS_TLS_KEY_FILE", "required when NATS_TLS_CERT_FILE"),
        (
            nats_env(pki.ca_file, "", good.key),
            "NATS_TLS_CERT_FILE",
            "required when NATS_TLS_KEY_FILE",
        ),
        (nats_env(pki.ca_file, good.cert, missing), "NATS_TLS_KEY_FILE", "cannot read"),
        (nats_env(pki.ca_file, good.cert, garbage), "NATS_TLS_KEY_FILE", "not a PEM private key"),
        (nats_env(pki.ca_file, good.cert, locked), "NATS_TLS_KEY_FILE", "encrypted"),
        (
            {"HTTP_TLS_CERT_FILE": str(expired.cert), "HTTP_TLS_KEY_FILE": str(expired.key)},
            "HTTP_TLS_CERT_FILE",
            "expired",
        ),
        ({"HTTP_TLS_CERT_FILE": str(good.cert)}, "HTTP_TLS_KEY_FILE", "required"),
        (
            {"HTTP_TLS_CERT_FILE": str(good.cert), "HTTP_TLS_KEY_FILE": str(foreign.key)},
            "HTTP_TLS_KEY_FILE",
            "does not match",
        ),
    ]


def test_every_bad_file_is_a_start_up_error_naming_its_variable(pki: Pki, tmp_path: Path) -> None:
    other = Pki(tmp_path / "other", name="another CA")
    said: dict[str, str] = {}
    for n, (env, variable, words) in enumerate(problems(pki, other, tmp_path)):
        with pytest.raises(ConfigError) as caught:
            Settings.from_env(env)
        message = str(caught.value)
        assert message.startswith(f"{variable}: "), (n, message)
        assert words in message, (n, message)
        said[f"case {n}"] = message
    assert_no_key_material(said, pki, other)
    assert "s3cret-passphrase" not in " ".join(said.values())


def test_arm_core_exits_2_naming_the_variable_and_showing_no_key(pki: Pki, tmp_path: Path) -> None:
    other = Pki(tmp_path / "other", name="another CA")
    good, foreign = pki.issue("bridge"), other.issue("stranger")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "HTTP_"))},
        "DATABASE_URL": "postgresql://arm@127.0.0.1:1/arm",
        **nats_env(pki.ca_file, good.cert, foreign.key),
    }
    arm_core = str(Path(sys.executable).with_name("arm-core"))
    for command in ("serve", "bridge", "reference"):
        done = subprocess.run(
            [arm_core, command], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, (command, done.stderr)
        assert "NATS_TLS_KEY_FILE: the key in" in done.stderr and "does not match" in done.stderr
        assert_no_key_material({command: done.stdout + done.stderr}, pki, other)


def test_a_database_urls_tls_parameters_show_masked_and_its_sslpassword_does_not() -> None:
    url = (
        "postgresql://arm:pw-secret@db.example:5432/arm?sslmode=verify-full"
        "&sslrootcert=/run/secrets/ca.crt&sslcert=/run/secrets/arm.crt"
        "&sslkey=/run/secrets/arm.key&sslpassword=key-secret"
    )
    shown = mask_url(url)
    assert "sslmode=verify-full" in shown and "sslrootcert=/run/secrets/ca.crt" in shown
    assert "sslkey=/run/secrets/arm.key" in shown
    assert "pw-secret" not in shown and "key-secret" not in shown
    settings = Settings.from_env({"DATABASE_URL": url})
    assert "key-secret" in settings.secrets() and "pw-secret" in settings.secrets()
    assert "key-secret" not in repr(settings) and "sslmode=verify-full" in repr(settings)


def test_the_expiry_metric_names_every_certificate_file_and_skips_what_libpq_judges(
    pki: Pki, tmp_path: Path
) -> None:
    """arm_tls_certificate_expiry_timestamp_seconds: the first expiry of each certificate
    file, by its variable; DATABASE_URL's files too (`system` is libpq's word for the
    system's CAs, not a file), one that cannot be read left out."""
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(days=3)).replace(microsecond=0)
    site = pki.issue("site", "localhost", not_after=soon)
    client = pki.issue("client", "arm-core")
    settings = Settings(
        http_tls_cert_file=str(site.cert),
        http_tls_key_file=str(site.key),
        nats_tls_ca_file=str(pki.ca_file),
        database_url=(
            f"postgresql://arm@db/arm?sslmode=verify-full&sslrootcert=system"
            f"&sslcert={client.cert}&sslkey={client.key}"
        ),
    )
    assert settings.certificate_files() == {
        "HTTP_TLS_CERT_FILE": str(site.cert),
        "NATS_TLS_CA_FILE": str(pki.ca_file),
        "DATABASE_URL sslcert": str(client.cert),
    }
    found = certificate_expiries(settings)
    assert found["HTTP_TLS_CERT_FILE"] == soon.timestamp()
    assert set(found) == {"HTTP_TLS_CERT_FILE", "NATS_TLS_CA_FILE", "DATABASE_URL sslcert"}
    missing = Settings(database_url=f"postgresql://arm@db/arm?sslrootcert={tmp_path / 'no.crt'}")
    assert certificate_expiries(missing) == {}
