"""The shape of the bridge's services: one Store per process, handed to them; one
config, the process's Settings (each variable read from there, never copied) and the
numbers that are no variable."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from arm_core.bridge.config import BridgeConfig
from arm_core.config import Settings
from arm_core.config_error import ConfigError

ROOT = Path(__file__).resolve().parents[2]
# The modules that may make the process's pool and its Store (and the store itself).
OWNERS = {"runtime.py", "store.py", "migrate.py"}


def runtime_sources() -> list[Path]:
    found = [*(ROOT / "bridge").glob("*.py"), *(ROOT / "http").glob("*.py")]
    found += (ROOT / "src" / "arm_core").glob("*.py")
    return sorted(found)


def test_no_service_imports_the_pool_or_builds_a_store() -> None:
    sources = runtime_sources()
    assert {"publisher.py", "inbox.py", "scheduler.py", "runner.py", "handlers.py"} <= {
        p.name for p in sources
    }
    for path in sources:
        if path.name in OWNERS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom | ast.Import):
                modules = [node.module] if isinstance(node, ast.ImportFrom) else []
                modules += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                assert not any(m and m.startswith("psycopg_pool") for m in modules), path
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("Store", "SyncStore"), f"{path}:{node.lineno}"


def test_the_config_declares_no_variable() -> None:
    """One home per variable: the bridge's config holds the Settings it is given, and no
    field of its own for a variable."""
    settings = Settings(outbox_batch_size=7, results_stream="RESULTS")
    assert BridgeConfig(settings).settings is settings
    assert BridgeConfig().settings == Settings()
    # A field named as a variable, or as its tail (batch_size for OUTBOX_BATCH_SIZE).
    parts = [name.split("_") for name in Settings.model_fields]
    variables = {"_".join(words[i:]) for words in parts for i in range(len(words))}
    own = {f.name for f in fields(BridgeConfig)} - {"settings"}
    assert own and not own & variables, own & variables


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"OUTBOX_POLL_SECONDS": "0"}, "OUTBOX_POLL_SECONDS"),
        ({"INBOX_BATCH_SIZE": "0"}, "INBOX_BATCH_SIZE"),
        ({"INBOX_WORKERS": "4", "INBOX_BUFFER_SIZE": "2"}, "INBOX_BUFFER_SIZE"),
        ({"INBOX_WORKERS": "4", "INBOX_MAX_PAYLOAD_BYTES": str(16 << 20)}, "INBOX_BUFFER_BYTES"),
        ({"TABULAR_MIN_IN_FLIGHT": "9", "TABULAR_MAX_IN_FLIGHT": "8"}, "TABULAR_MIN_IN_FLIGHT"),
        ({"LIVENESS_STALL_SECONDS": "10"}, "LIVENESS_STALL_SECONDS"),
    ],
)
def test_the_variables_the_services_read_are_checked_at_start(
    env: dict[str, str], variable: str
) -> None:
    """What a service's config checked of a variable's value when made, Settings checks
    at start, naming the variable (exit 2); 0 republishes stays allowed."""
    with pytest.raises(ConfigError, match=f"^{variable}: "):
        Settings.from_env(env)
    assert Settings.from_env({"OUTBOX_MAX_REPUBLISH": "0"}).outbox_max_republish == 0
