"""The one error of configuration, raised by arm_core.config and the modules it uses."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration variable is missing or has a value that cannot be used."""
