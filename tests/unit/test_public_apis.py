"""The runtime uses only the public API of the packages it depends on: no file of the
runtime package (src/arm_core/ without its devtools/, bridge/, http/) reaches a private
name of a third-party package, so an upgrade within the bounds of pyproject.toml cannot
break it silently.

ruff's SLF001 (pyproject.toml, for the runtime) refuses every ``x._name`` on anything
but ``self``/``cls``: ``web._run_app``, ``nc._send_unsubscribe(sub._id)``,
``self.nats._send_ping()``. This test reads each file's syntax tree for what ruff cannot
see:

* an import of a ``_``-prefixed name, or from a ``_``-prefixed module, of those packages
  (``from aiohttp.web_protocol import _ErrInfo``, ``import aiohttp._http_parser``);
* ``getattr``, ``setattr`` or ``hasattr`` of a ``_``-prefixed name on anything but
  ``self``/``cls``;
* in a class derived from one of their classes, a ``self._x`` the class itself never
  defines: the base's private state (``self._messages`` in a RequestHandler subclass).

The project's own ``self._x`` is never flagged: a class that does not derive from a
third-party class owns its private names, and one that does may use those it defines.
Dunder names (``__init__``, ``__name__``) are not private.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("src/arm_core", "bridge", "http")
NOT_RUNTIME = Path("src/arm_core/devtools")

# Import names of the runtime's dependencies (pyproject.toml) and of what they bring
# that the code could import directly.
THIRD_PARTY = frozenset(
    {
        "aiohttp",
        "jsonschema_rs",
        "multidict",
        "nats",
        "nkeys",
        "prometheus_client",
        "psycopg",
        "psycopg_pool",
        "pydantic",
        "pydantic_core",
        "pydantic_settings",
        "rfc3339_validator",
        "structlog",
        "yarl",
        "yoyo",
    }
)

OWN = frozenset({"self", "cls"})


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def root_package(module: str | None) -> str:
    return (module or "").split(".")[0]


@dataclass(frozen=True)
class Use:
    line: int
    what: str


def _root(node: ast.expr) -> ast.expr:
    """`a.b.c` → Name a."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _third_party_names(tree: ast.Module) -> set[str]:
    """The names a module binds to third-party modules or objects by importing them."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if root_package(alias.name) in THIRD_PARTY:
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if root_package(node.module) in THIRD_PARTY:
                bound.update(alias.asname or alias.name for alias in node.names)
    return bound


def _is_third_party(base: ast.expr, bound: set[str]) -> bool:
    root = _root(base)
    return isinstance(root, ast.Name) and root.id in bound


def _own_names(cls: ast.ClassDef) -> set[str]:
    """What a class defines itself: its body's functions and assignments, and every
    attribute it assigns on self."""
    names: set[str] = set()
    for statement in cls.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            names.update(t.id for t in statement.targets if isinstance(t, ast.Name))
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in OWN
        ):
            names.add(node.attr)
    return names


def private_uses(source: str, filename: str = "<source>") -> list[Use]:
    """Every reach into a third-party package's private names in `source`."""
    tree = ast.parse(source, filename)
    bound = _third_party_names(tree)
    uses: list[Use] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and root_package(node.module) in THIRD_PARTY:
            module = node.module or ""
            for alias in node.names:
                if private(alias.name) or any(map(private, module.split("."))):
                    uses.append(Use(node.lineno, f"from {module} import {alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in THIRD_PARTY and any(map(private, parts)):
                    uses.append(Use(node.lineno, f"import {alias.name}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private(node.args[1].value)
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id in OWN)
        ):
            uses.append(Use(node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ClassDef) and any(
            _is_third_party(base, bound) for base in node.bases
        ):
            own = _own_names(node)
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Attribute)
                    and isinstance(inner.value, ast.Name)
                    and inner.value.id in OWN
                    and private(inner.attr)
                    and inner.attr not in own
                ):
                    what = f"{inner.value.id}.{inner.attr} (of {node.name}'s base)"
                    uses.append(Use(inner.lineno, what))
    return sorted(set(uses), key=lambda use: (use.line, use.what))


def runtime_files() -> list[Path]:
    """The runtime's Python files, relative to the repository."""
    found: list[Path] = []
    for top in RUNTIME:
        for folder, dirs, files in os.walk(ROOT / top):
            here = Path(folder).relative_to(ROOT)
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and here / d != NOT_RUNTIME)
            found += [here / name for name in files if name.endswith(".py")]
    return sorted(found)


def test_the_runtime_reaches_no_private_name_of_a_dependency() -> None:
    files = runtime_files()
    tops = {top for top in RUNTIME for path in files if path.is_relative_to(top)}
    assert tops == set(RUNTIME), tops  # each part of the runtime was read
    assert not any(path.is_relative_to(NOT_RUNTIME) for path in files)
    assert len(files) >= 20, files
    found = [
        f"{path}:{use.line}: {use.what}"
        for path in files
        for use in private_uses((ROOT / path).read_text(encoding="utf-8"), str(path))
    ]
    assert found == [], "private names of third-party packages:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "from aiohttp.web_protocol import _ErrInfo",
        "from aiohttp.web_protocol import RequestHandler, _ErrInfo as Err",
        "from aiohttp._http_parser import HttpRequestParser",
        "import aiohttp._http_parser",
        "def f(sub):\n    return getattr(sub, '_id')",
        (
            "from aiohttp import web\n"
            "class H(web.RequestHandler):\n"
            "    def data_received(self, data):\n"
            "        return self._request_count\n"
        ),
        (
            "from aiohttp.web_protocol import RequestHandler\n"
            "class H(RequestHandler):\n"
            "    def __init__(self):\n"
            "        self._mine = 1\n"
            "    def f(self):\n"
            "        return self._mine, self._waiter\n"
        ),
    ],
)
def test_the_check_finds_a_private_use(source: str) -> None:
    assert private_uses(source), source


@pytest.mark.parametrize(
    "source",
    [
        # The project's own private names, including ones that a dependency also has.
        (
            "class Publisher:\n"
            "    def __init__(self):\n"
            "        self._close = False\n"
            "        self._id = 1\n"
            "    def f(self):\n"
            "        return self._close, self._id, self._helper()\n"
            "    def _helper(self):\n"
            "        return getattr(self, '_id')\n"
        ),
        (
            "from prometheus_client.registry import Collector\n"
            "class Gauges(Collector):\n"
            "    _cache = None\n"
            "    def __init__(self):\n"
            "        self._store = 1\n"
            "    def collect(self):\n"
            "        return self._store, self._cache, self._read()\n"
            "    def _read(self):\n"
            "        return 1\n"
        ),
        # Public names and dunders of third-party objects; private names of the stdlib
        # and of the project (out of scope here).
        "from aiohttp import web\nweb.AppRunner(app, keepalive_timeout=1.0)",
        "from aiohttp import web\nname = web.Application.__name__",
        "from collections import namedtuple\nP = namedtuple('P', 'a')\nP(1)._replace(a=2)",
        "import os\nos._exit(0)",
        "from arm_core.store import _private_helper",
    ],
)
def test_the_check_passes_public_and_own_names(source: str) -> None:
    assert private_uses(source) == []


@pytest.mark.parametrize("where", ["bridge/x.py", "http/x.py", "src/arm_core/x.py"])
def test_ruff_refuses_a_private_attribute_of_a_dependency_in_the_runtime(where: str) -> None:
    """What this test no longer checks itself, ruff does (pyproject.toml's SLF001)."""
    source = (
        "from aiohttp import web\n\n\n"
        "async def f(nc, sub, app):\n"
        "    web._run_app(app)\n"
        "    await nc._send_unsubscribe(sub._id)\n"
    )
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff), "check", "--output-format", "concise", "--stdin-filename", where, "-"],
        input=source,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    flagged = [line for line in done.stdout.splitlines() if "SLF001" in line]
    assert len(flagged) == 3, done.stdout + done.stderr
