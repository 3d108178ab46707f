"""Every example that carries API_TOKENS gives each token, under the arm-core version the
example runs, the actor and the levels its text claims: `actor:level=token` that level
only (the scrape token `metrics`, nothing else), `actor=token` every level.

The version an example runs: the Kubernetes manifests' image tag (one for all of them,
which the migrate Job's name carries); compose.yaml builds this checkout, the systemd
units install one and the pages describe this tree, so they run this tree. A pinned
version must be this tree's release or the previous release, whose parser runs from its
wheel (tests/fixtures/previous_release): a version this suite cannot run is a failure,
not a guess. `<placeholders>` (and `…`) become tokens of the right length, one each."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from arm_core.access import EVERY_LEVEL, LEVELS
from arm_core.config import parse_tokens
from arm_core.devtools.release import release_of, wheel_version
from arm_core.version import installed
from tests.support.previous_release import PROGRAM, environment, previous_wheel, unpacked

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
IMAGE = re.compile(r"^\s*image:\s*\S*/arm-core:(\S+)\s*$", re.MULTILINE)
EVERY = tuple(sorted(level.value for level in EVERY_LEVEL))

# What a version makes of API_TOKENS, run in that version's own code: (actor, token,
# levels), levels None for "every level". 1.0.0 knew no levels (arm_core.config._tokens:
# `actor=token`, every token may do everything); later versions parse with
# arm_core.config.parse_tokens.
PARSE = """
import json, sys
raw = sys.stdin.read()
try:
    from arm_core.config import parse_tokens
except ImportError:
    from arm_core.config import _tokens
    print(json.dumps([[actor, token, None] for actor, token in _tokens("API_TOKENS", raw)]))
else:
    parsed = parse_tokens(raw)
    print(json.dumps([[t.actor, t.token, sorted(t.levels)] for t in parsed]))
"""

Grants = dict[str, tuple[str, tuple[str, ...]]]  # token → (actor, levels)


@dataclass(frozen=True)
class Example:
    where: str
    raw: str
    version: str


def filled(raw: str) -> str:
    """Each `<placeholder>` (or `…`) a distinct 20-character token (a valid actor name
    too)."""
    count = iter(range(1, 1000))
    return re.sub(r"<[^>]*>|…", lambda _: f"placeholder{next(count):03d}xxxxxx", raw)


def kubernetes_version() -> str:
    pins = {
        (path.name, tag)
        for path in KUBERNETES.glob("*.yaml")
        for tag in IMAGE.findall(path.read_text(encoding="utf-8"))
    }
    versions = {tag for _, tag in pins}
    assert len(versions) == 1, f"the manifests pin different versions: {sorted(pins)}"
    [version] = versions
    return version


def examples() -> list[Example]:
    this_tree = release_of(installed())
    found: list[Example] = []
    for doc in yaml.safe_load_all((KUBERNETES / "secret.example.yaml").read_text("utf-8")):
        if "api-tokens" in doc.get("stringData", {}):
            raw = doc["stringData"]["api-tokens"]
            found.append(Example("secret.example.yaml", raw, kubernetes_version()))
    for path in sorted((ROOT / "deploy" / "systemd").glob("*.env.example")):
        for m in re.finditer(r"^#?API_TOKENS=(.+)$", path.read_text("utf-8"), re.MULTILINE):
            found.append(Example(path.name, m[1], this_tree))
    for path in sorted((ROOT / "docs").glob("*.md")):
        for m in re.finditer(r"\bAPI_TOKENS=(\S+)", path.read_text("utf-8")):
            found.append(Example(f"docs/{path.name}", m[1], this_tree))
    compose = (ROOT / "compose.yaml").read_text("utf-8")
    for m in re.finditer(r"API_TOKENS: \$\{API_TOKENS:-([^}]+)\}", compose):
        found.append(Example("compose.yaml", m[1], this_tree))
    return found


def claimed(raw: str) -> Grants:
    """What the text says each token gets, read as this tree documents the syntax."""
    grants: Grants = {}
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        who, _, token = entry.partition("=")
        actor, _, level = who.rpartition(":")
        if actor and level in LEVELS:
            grants[token.strip()] = (actor.strip(), (level,))
        else:
            grants[token.strip()] = (who.strip(), EVERY)
    return grants


def this_tree_grants(raw: str) -> Grants:
    return {
        t.token: (t.actor, tuple(sorted(level.value for level in t.levels)))
        for t in parse_tokens(raw)
    }


def previous_grants(site: Path, raw: str) -> Grants:
    done = subprocess.run(
        [PROGRAM[0], "-c", PARSE],
        input=raw,
        capture_output=True,
        text=True,
        env={**environment(site), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {
        token: (actor, EVERY if levels is None else tuple(levels))
        for actor, token, levels in json.loads(done.stdout)
    }


def mismatches(claims: Grants, grants: Grants) -> list[str]:
    """Each token whose actor or levels differ from its claim (never the token itself)."""
    return [
        f"entry {n}: the text says {claims[token]}, the version gives {grants.get(token)}"
        for n, token in enumerate(claims, 1)
        if grants.get(token) != claims[token]
    ]


@pytest.fixture(scope="module")
def previous_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpacked(tmp_path_factory.mktemp("previous_release"))


def grants_under(version: str, raw: str, previous_site: Path) -> Grants:
    if version == release_of(installed()):
        return this_tree_grants(raw)
    if version == wheel_version(previous_wheel()):
        return previous_grants(previous_site, raw)
    pytest.fail(
        f"pinned to {version}: neither this tree's release ({release_of(installed())}) nor "
        f"the previous release ({wheel_version(previous_wheel())}), so nothing here can "
        "say what it makes of the tokens"
    )


@pytest.mark.parametrize("example", examples(), ids=lambda e: e.where)
def test_each_example_s_tokens_get_the_levels_it_claims_under_its_version(
    example: Example, previous_site: Path
) -> None:
    raw = filled(example.raw)
    claims = claimed(raw)
    assert claims, f"{example.where}: no token"
    found = mismatches(claims, grants_under(example.version, raw, previous_site))
    assert not found, f"{example.where} under arm-core {example.version}: {found}"


def test_every_example_that_carries_tokens_is_read() -> None:
    """A change of an example's form cannot drop it from the check unseen."""
    assert {e.where for e in examples()} >= {
        "secret.example.yaml",
        "serve.env.example",
        "compose.yaml",
        "docs/security.md",
    }


def test_the_kubernetes_scrape_token_reads_metrics_only() -> None:
    [secret] = [e for e in examples() if e.where == "secret.example.yaml"]
    scrapers = [g for g in claimed(filled(secret.raw)).values() if g[0] == "prometheus"]
    assert scrapers == [("prometheus", ("metrics",))]


def test_the_migrate_job_is_named_for_the_version_it_runs() -> None:
    job = (KUBERNETES / "migrate-job.yaml").read_text("utf-8")
    assert f"name: arm-core-migrate-{kubernetes_version().replace('.', '-')}\n" in job


def test_the_previous_release_runs_its_own_parser(previous_site: Path) -> None:
    """The check runs the previous release's code: the form every version reads,
    `actor=token`, comes back as that version reads it."""
    raw = "ops=abcdefghijklmnopq"
    assert previous_grants(previous_site, raw) == {"abcdefghijklmnopq": ("ops", EVERY)}


def test_a_level_the_version_does_not_give_is_reported() -> None:
    """What the scrape token of secret.example.yaml is under 1.0.0: an actor named
    `prometheus:metrics` with every level."""
    claims = claimed("prometheus:metrics=abcdefghijklmnopq")
    under_1_0_0 = {"abcdefghijklmnopq": ("prometheus:metrics", EVERY)}
    assert mismatches(claims, under_1_0_0) == [
        "entry 1: the text says ('prometheus', ('metrics',)), the version gives "
        f"('prometheus:metrics', {EVERY})"
    ]
