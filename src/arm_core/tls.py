"""TLS files, read and checked when the process starts, so a deployment that cannot work
fails at once, exit 2, naming the variable; no message quotes a file's content, only its
path, a certificate's subject and dates. Settings builds its contexts with these, on the
standard library's defaults: TLS 1.2 or later, and a client always verifies the server's
certificate and name.
"""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

from cryptography import x509

from arm_core.config_error import ConfigError


def _read(var: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{var}: cannot read {path!r}: {exc.strerror or exc}") from None


def check_certificates(var: str, path: str) -> list[x509.Certificate]:
    """The PEM certificates in `path` (a certificate, its chain, or a CA bundle), each
    within its validity period. Raises ConfigError naming `var`."""
    data = _read(var, path)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ConfigError(f"{var}: {path!r} holds no PEM certificate") from None
    now = dt.datetime.now(dt.UTC)
    for cert in certs:
        if cert.not_valid_after_utc < now:
            when = f"expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M}"
        elif cert.not_valid_before_utc > now:
            when = f"is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M}"
        else:
            continue
        subject = cert.subject.rfc4514_string() or "(no subject)"
        raise ConfigError(f"{var}: the certificate {subject!r} in {path!r} {when} UTC")
    return certs


def expires_at(var: str, path: str) -> dt.datetime:
    """When the first certificate in `path` to expire does (checked as
    check_certificates does): arm_tls_certificate_expiry_timestamp_seconds."""
    return min(cert.not_valid_after_utc for cert in check_certificates(var, path))


def load_pair(context: ssl.SSLContext, cert_var: str, cert: str, key_var: str, key: str) -> None:
    """The certificate (and its chain) and its key into `context`, checked, when given."""
    if bool(cert) != bool(key):
        missing, given = (key_var, cert_var) if cert else (cert_var, key_var)
        raise ConfigError(f"{missing}: required when {given} is set")
    if not cert:
        return
    check_certificates(cert_var, cert)
    _read(key_var, key)  # unreadable: named as the key's variable, not the certificate's

    def no_passphrase() -> bytes:
        raise ConfigError(
            f"{key_var}: the key is encrypted; give the key unencrypted, in a file only this "
            "process's user may read (mounted read-only)"
        )

    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in (exc.reason or "").upper():
            raise ConfigError(
                f"{key_var}: the key in {key!r} does not match the certificate of {cert_var}"
            ) from None
        raise ConfigError(
            f"{key_var}: {key!r} is not a PEM private key for {cert_var} ({exc.reason})"
        ) from None


def own_certificate_context(cert_file: str) -> ssl.SSLContext:
    """What `arm-core healthcheck` trusts when the process it asks serves HTTPS: exactly
    the certificate in HTTP_TLS_CERT_FILE (pinned: its chain need not be installed here),
    whatever name it was issued to, since the probe asks over loopback."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cert_file)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.check_hostname = False  # loopback; the certificate itself is pinned
    return context
