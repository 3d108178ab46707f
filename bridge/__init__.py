"""The NATS bridge: the package arm_core.bridge (pyproject.toml [tool.setuptools.package-dir]
maps bridge/ to it)."""
