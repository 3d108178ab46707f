"""docs/configuration.md is what arm_core.devtools.config_doc writes from the settings:
every variable of Settings and of the reference services, with its default and meaning."""

from __future__ import annotations

import pytest
from pydantic import Field

from arm_core.config import Settings
from arm_core.devtools import config_doc
from arm_core.devtools.reference import ReferenceConfig


def test_the_page_is_what_the_generator_writes() -> None:
    expected = config_doc.render()
    actual = config_doc.DOC_PATH.read_text(encoding="utf-8") if config_doc.DOC_PATH.exists() else ""
    assert actual == expected, (
        f"docs/configuration.md is stale: run `{config_doc.REGENERATE}`\n"
        + config_doc.diff(actual, expected)
    )


def test_every_variable_is_listed_with_its_default() -> None:
    page = config_doc.render()
    for cls in (Settings, ReferenceConfig):
        for name, default in config_doc.env_fields(cls):
            assert f"| `{name}` | {config_doc.shown_default(name, default)} |" in page, name
    for name in config_doc.OTHER_VARIABLES:
        assert f"| `{name}` |" in page, name


def test_the_pool_size_shows_its_default_for_the_default_settings_and_its_formula() -> None:
    [row] = [r for r in config_doc.render().splitlines() if "`DATABASE_POOL_MAX_SIZE`" in r]
    assert f"| {Settings().pool_max_size()} (computed) |" in row
    assert "`OUTBOX_PUBLISHERS + INBOX_WORKERS + 1 + 4`" in row
    assert f"`NATS_ENABLED=false`, {Settings(nats_enabled=False).pool_max_size()}" in row
    assert "LISTEN" in row


def test_a_variable_without_a_meaning_fails_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    class WithANewVariable(Settings):
        brand_new: str = Field("", alias="BRAND_NEW_VARIABLE")  # no docstring: no meaning

    monkeypatch.setattr(config_doc, "Settings", WithANewVariable)
    with pytest.raises(config_doc.MeaningError, match="BRAND_NEW_VARIABLE"):
        config_doc.render()


def test_a_meaning_is_the_fields_docstring() -> None:
    """Each variable is written once: its field's docstring is the page's meaning."""
    [row] = [r for r in config_doc.render().splitlines() if r.startswith("| `INBOX_BATCH_SIZE` |")]
    assert row.endswith(f"| {Settings.model_fields['inbox_batch_size'].description} |")


def test_a_derived_default_is_described_not_shown_as_none() -> None:
    """RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS' field holds None: its default comes from
    ACK_TIMEOUT_SECONDS, and the page says how."""
    shown = config_doc.shown_default("RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS", None)
    assert "ACK_TIMEOUT_SECONDS" in shown
    with pytest.raises(config_doc.MeaningError, match="has a default of its own"):
        config_doc.shown_default("RESULTS_STREAM_DUPLICATE_WINDOW_SECONDS", 120.0)


def test_defaults_as_the_page_shows_them() -> None:
    assert config_doc.default_text(None) == "—"
    assert config_doc.default_text(True) == "`true`"
    assert config_doc.default_text(5.0) == "5"
    assert config_doc.default_text(0.5) == "0.5"
    assert config_doc.default_text(("nats://a:4222",)) == "`nats://a:4222`"
    assert config_doc.default_text(()) == "empty"
    assert config_doc.default_text("") == "empty"
