"""The running arm-core's version: the installed distribution's, which pyproject.toml
sets. The one source of what `arm-core --version`, GET /healthcheck, GET /api/v1/status
(the console's footer) and each bridge's row say. Between releases it is the next
release as a pre-release (`1.1.0.dev0`): a tree that is no release says so."""

from __future__ import annotations

import importlib.metadata


def installed() -> str:
    return importlib.metadata.version("arm-core")
