"""The one error of configuration: :class:`ConfigError`, raised by the parsers of
arm_core.config_* and the NATS credential checks of arm_core.nats_credentials (kept apart
so that both can raise it without importing each other)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration variable is missing or has a value that cannot be used."""
