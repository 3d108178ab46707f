"""Credentials for a real nats-server in operator (decentralised JWT) mode: an operator,
an account and a user, each an nkey, with JWTs signed by hand as nsc would sign them; and
nkey users for a configuration file's `authorization` block (deploy/nats/)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _key(prefix: int) -> tuple[str, nkeys.KeyPair]:
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed.decode(), nkeys.from_seed(seed)


def user_nkey() -> tuple[str, str]:
    """A fresh NATS user's nkey: its seed (SU…) and its public key (U…)."""
    seed, user = _key(nkeys.PREFIX_BYTE_USER)
    return seed, user.public_key.decode()


def _jwt(issuer: nkeys.KeyPair, subject: str, name: str, claims: dict[str, Any]) -> str:
    body: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": issuer.public_key.decode(),
        "name": name,
        "sub": subject,
        "nats": {**claims, "version": 2},
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    payload = _b64(json.dumps(body).encode())
    return f"{head}.{payload}.{_b64(issuer.sign(f'{head}.{payload}'.encode()))}"


@dataclass(frozen=True)
class OperatorMode:
    server_config: str
    user_seed: str
    user_jwt: str

    def write_config(self, directory: Path) -> Path:
        path = directory / "operator.conf"
        path.write_text(self.server_config)
        return path


def operator_mode() -> OperatorMode:
    _, operator = _key(nkeys.PREFIX_BYTE_OPERATOR)
    _, account = _key(nkeys.PREFIX_BYTE_ACCOUNT)
    user_seed, user = _key(nkeys.PREFIX_BYTE_USER)
    unlimited = {"subs": -1, "data": -1, "payload": -1}
    operator_jwt = _jwt(operator, operator.public_key.decode(), "arm-test", {"type": "operator"})
    account_jwt = _jwt(
        operator,
        account.public_key.decode(),
        "arm",
        {
            "type": "account",
            "limits": {
                **unlimited,
                "imports": -1,
                "exports": -1,
                "wildcards": True,
                "conn": -1,
                "leaf": -1,
            },
        },
    )
    user_jwt = _jwt(
        account,
        user.public_key.decode(),
        "arm-core",
        {"type": "user", "pub": {}, "sub": {}, **unlimited},
    )
    config = (
        f'operator: "{operator_jwt}"\n'
        "resolver: MEMORY\n"
        f'resolver_preload: {{\n  {account.public_key.decode()}: "{account_jwt}"\n}}\n'
    )
    return OperatorMode(config, user_seed, user_jwt)


def user_jwt_for(seed: str) -> str:
    """A user JWT for the user of `seed`, issued by an account of its own (operator
    mode's credential, which a server of nkey users does not take)."""
    user = nkeys.from_seed(seed.encode())
    _, account = _key(nkeys.PREFIX_BYTE_ACCOUNT)
    claims = {"type": "user", "pub": {}, "sub": {}}
    return _jwt(account, user.public_key.decode(), "arm-core", claims)


@dataclass(frozen=True)
class NkeyUsers:
    """A nats-server configuration: `snippet` verbatim, after a fresh nkey user for each
    `$NAME` it refers to, defined as a variable above it (as an operator would)."""

    server_config: str
    seeds: dict[str, str]  # variable name (ARM_CORE_NKEY) → that user's seed

    def write_config(self, directory: Path) -> Path:
        path = directory / "users.conf"
        path.write_text(self.server_config)
        return path


def nkey_users(snippet: str) -> NkeyUsers:
    lines = [line for line in snippet.splitlines() if not line.lstrip().startswith("#")]
    names = sorted(set(re.findall(r"nkey:\s*\$([A-Za-z_][A-Za-z0-9_]*)", "\n".join(lines))))
    seeds, defined = {}, []
    for name in names:
        seeds[name], public = user_nkey()
        defined.append(f'{name}: "{public}"\n')
    return NkeyUsers("".join(defined) + snippet, seeds)
