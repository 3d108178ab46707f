"""Certificates made by the test (trustme): a private CA, server and client certificates
in files, as a deployment mounts them; and what a log must never show of them."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Pair:
    """A certificate (with its chain) and its private key, in files."""

    cert: Path
    key: Path


@dataclass
class Pki:
    """A CA of the test's own, writing everything it issues under `root`."""

    root: Path
    name: str = "arm-core test CA"
    ca: trustme.CA = field(init=False)
    written: list[Path] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA(organization_name=self.name)

    @property
    def ca_file(self) -> Path:
        path = self.root / f"{self._slug(self.name)}.crt"
        if not path.exists():
            self.ca.cert_pem.write_to_path(str(path))
            self.written.append(path)
        return path

    def issue(
        self,
        name: str,
        *identities: str,
        not_before: dt.datetime | None = None,
        not_after: dt.datetime | None = None,
    ) -> Pair:
        """A certificate for `identities` (host names, IP addresses; a client's name),
        signed by this CA, with its key; the files are `name`.crt and `name`.key (0600)."""
        leaf = self.ca.issue_cert(
            *(identities or (name,)),
            common_name=name,
            not_before=not_before,
            not_after=not_after,
        )
        cert, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        key.write_bytes(leaf.private_key_pem.bytes())
        key.chmod(0o600)
        self.written += [cert, key]
        return Pair(cert, key)

    def material(self) -> list[str]:
        """Every line of base64 in the files written: what no log line may contain."""
        lines: list[str] = []
        for path in self.written:
            for line in path.read_text().splitlines():
                if line and not line.startswith("-----") and len(line) >= 32:
                    lines.append(line)
        return lines

    @staticmethod
    def _slug(text: str) -> str:
        return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def assert_no_key_material(texts: dict[str, str], *pkis: Pki) -> None:
    """No text (a process's log, an error message) holds a PEM block or a line of the
    certificates and keys the test wrote."""
    material = [line for pki in pkis for line in pki.material()]
    assert material, "nothing written to look for"
    for where, text in texts.items():
        assert "-----BEGIN" not in text, where
        leaked = [line for line in material if line in text]
        assert not leaked, (where, leaked[:1])
