"""NATS credentials: the user nkey seed and its JWT (``OPENBAO__NATS__NATS_SEED``,
``OPENBAO__NATS__NATS_JWT``), checked together at start by :func:`nats_keypair`, so a seed
or JWT that cannot work is a :class:`ConfigError` naming its variable — never quoting any
of it — instead of a connection that retries forever.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

import nkeys

from arm_core.config_error import ConfigError

SEED_VAR = "OPENBAO__NATS__NATS_SEED"
JWT_VAR = "OPENBAO__NATS__NATS_JWT"
_SEED_KINDS = {
    nkeys.PREFIX_BYTE_OPERATOR: "an operator",
    nkeys.PREFIX_BYTE_ACCOUNT: "an account",
    nkeys.PREFIX_BYTE_SERVER: "a server",
    nkeys.PREFIX_BYTE_CLUSTER: "a cluster",
}
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")


def user_keypair(name: str, seed: str) -> nkeys.KeyPair:
    """The key pair of a NATS *user* nkey seed (SU…, 58 characters, base32 with a
    CRC-16 checksum), or ConfigError naming `name` that says what is wrong and quotes
    no part of the seed. (nkeys.from_seed checks neither the checksum nor the role.)"""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{name}: not a valid nkey seed ({why})")

    if seed.startswith("eyJ"):
        raise bad(f"it looks like a JWT, which belongs in {JWT_VAR}")
    if not seed.isascii() or len(seed) != 58:
        raise bad(f"a user seed has 58 characters, this has {len(seed)}")
    if seed[0] != "S":
        raise bad("a seed starts with S; a public key or another secret was given")
    try:
        raw = base64.b32decode(seed + "======")
    except binascii.Error:
        raise bad("not base32: only A-Z and 2-7") from None
    # A last character that differs only in base32's unused bits decodes the same:
    # still a typo, and not the seed that was issued.
    canonical = base64.b32encode(raw).rstrip(b"=") == seed.encode()
    if not canonical or nkeys.crc16_checksum(raw[:-2]) != raw[-2:]:
        raise bad("its checksum does not match: a character is wrong, swapped or cut off")
    try:
        prefix, _ = nkeys.decode_seed(seed.encode())
    except nkeys.NkeysError:
        raise bad("not a seed of any nkey kind") from None
    if prefix != nkeys.PREFIX_BYTE_USER:
        kind = _SEED_KINDS.get(prefix, "another kind of")
        raise bad(f"{kind} seed; arm-core connects as a user, whose seed starts with SU")
    return nkeys.from_seed(seed.encode())


def jwt_payload(name: str, jwt: str) -> dict[str, Any]:
    """The claims of a JWT of the right shape — three base64url parts, the header and
    the payload JSON objects — or ConfigError naming `name` (quoting none of it)."""
    parts = jwt.split(".")
    if len(parts) != 3 or not all(_BASE64URL.fullmatch(p) for p in parts):
        raise ConfigError(
            f"{name}: not a JWT (three base64url parts joined by dots; a .creds file's "
            "JWT line alone is wanted)"
        )
    for part, what in zip(parts, ("header", "payload"), strict=False):
        try:
            value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
        except (binascii.Error, ValueError):
            value = None
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: not a JWT (its {what} is not a base64url JSON object)")
    return value


def nats_keypair(seed: str, jwt: str) -> nkeys.KeyPair | None:
    """Checks the NATS credentials together: a JWT needs the seed of the user it was
    issued to. None when there are no credentials."""
    if jwt and not seed:
        raise ConfigError(f"{SEED_VAR}: required when {JWT_VAR} is set")
    if not seed:
        return None
    keypair = user_keypair(SEED_VAR, seed)
    if jwt:
        subject = jwt_payload(JWT_VAR, jwt).get("sub")
        if isinstance(subject, str) and subject != keypair.public_key.decode():
            raise ConfigError(
                f"{JWT_VAR}: issued to another user than the key of {SEED_VAR} "
                "(its sub is not that seed's public key)"
            )
    return keypair
