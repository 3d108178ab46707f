"""arm-core, the recognition job exchange: one package assembled by pyproject.toml's
package-dir from src/arm_core, bridge/, http/, db/ and docs/contracts/."""

from importlib.util import find_spec as _find_spec

# `pip install -e .` in setuptools' default editable mode installs a package that cannot
# import arm_core.http (http/ has no __init__.py, so that it never shadows the standard
# library's http, and that mode cannot map such a folder into a package). It would fail
# at the first request; it fails here instead, saying what to run.
if _find_spec("arm_core.http") is None:
    raise ImportError(
        "arm_core.http cannot be imported: this is a `pip install -e .` in setuptools' "
        "default editable mode; run `make install` (pip install -e . --config-settings "
        "editable_mode=strict)"
    )
