"""The shape of the bridge's services: one Store per process, handed to them; a config
of their own, built from the settings in one place and checked when made."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from arm_core.bridge.config import (
    BridgeConfig,
    InboxConfig,
    PublisherConfig,
    SchedulerConfig,
    bridge_config,
)
from arm_core.config import Settings

ROOT = Path(__file__).resolve().parents[2]
# The modules that may make the process's pool and its Store (and the store itself, with
# its plumbing).
OWNERS = {"runtime.py", "store.py", "pooled.py", "migrate.py"}


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


def test_the_services_configs_default_to_the_settings_defaults() -> None:
    """One default per tunable: what a service gets when the environment says nothing is
    what its own config says when a test makes it bare."""
    assert bridge_config(Settings()) == BridgeConfig()


def test_each_given_setting_reaches_its_service() -> None:
    settings = Settings(
        outbox_batch_size=7,
        inbox_workers=3,
        inbox_buffer_size=30,
        schedule_tick_seconds=2.5,
        results_stream="RESULTS",
        nats_queue_group="group-a",
    )
    config = bridge_config(settings)
    assert (config.publisher.batch_size, config.inbox.workers, config.inbox.buffer_size) == (
        7,
        3,
        30,
    )
    assert config.scheduler.tick_seconds == 2.5
    assert (config.results_stream, config.queue_group) == ("RESULTS", "group-a")
    assert config.scheduler.sweep_interval_seconds is None  # not given: the DBA's stands
    given = Settings.from_env({"TIMEOUT_SWEEP_SECONDS": "12", "DATABASE_URL": "postgresql://x"})
    assert bridge_config(given).scheduler.sweep_interval_seconds == 12


@pytest.mark.parametrize("config", [PublisherConfig, InboxConfig, SchedulerConfig, BridgeConfig])
def test_a_config_refuses_a_number_that_cannot_work(config: type) -> None:
    numbers = [
        f.name
        for f in fields(config)
        if f.type in ("int", "float") and f.name not in {"max_republish"}
    ]
    assert numbers
    for name in numbers:
        with pytest.raises(ValueError, match=name):
            config(**{name: -1})


def test_zero_is_refused_where_it_would_spin_and_allowed_where_it_means_at_once() -> None:
    with pytest.raises(ValueError, match="poll_seconds"):
        PublisherConfig(poll_seconds=0)
    with pytest.raises(ValueError, match="batch_size"):
        InboxConfig(batch_size=0)
    assert PublisherConfig(ack_timeout_seconds=0, max_republish=0).max_republish == 0
    with pytest.raises(ValueError, match="workers"):
        InboxConfig(workers=4, buffer_size=2)
