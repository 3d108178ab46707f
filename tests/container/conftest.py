"""The image built once per session from the repository's Containerfile (on a base made
from Debian packages: src/arm_core/devtools/testbed/images.py), for every container test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from arm_core.devtools.testbed.images import build_image, missing, remove_image


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.skip("the container tests run rootful podman and mmdebstrap: run them as root")
    tag = build_image(tmp_path_factory.mktemp("image"))
    try:
        yield tag
    finally:
        remove_image(tag)
