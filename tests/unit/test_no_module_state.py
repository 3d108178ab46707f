"""The runtime keeps no mutable state in module globals: what a process observes (its
metrics, outage, pool exhaustion, waits) lives on its Instruments and is handed to the
services, so two bridges in one process never share it and no test has to drain it.

Every name a module of the package assigns at its top level must hold a value that
cannot change — a number, a string, a path, a tuple or frozenset of such, a read-only
mapping, a frozen dataclass or NamedTuple, an enum, a class, a function, a compiled
pattern, or one of the process-wide handles that are meant to be (a logger, an aiohttp
key, a context variable, a type alias) — or be a table written as a dict, list or set
literal that no code of the package ever changes. No function declares a `global`."""

from __future__ import annotations

import ast
import contextvars
import dataclasses
import datetime as dt
import enum
import importlib
import logging
import re
import types
import typing
from pathlib import Path, PurePath
from typing import Any

from aiohttp import web

import arm_core

PACKAGE = Path(arm_core.__path__[0])  # the installed package: bridge/ and http/ included


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(("arm_core", *parts)), path))
    return found


def _assigned(path: Path) -> list[str]:
    """The names a module assigns at its top level (not the ones it imports or defines
    with def/class)."""
    names: list[str] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        elif isinstance(node, ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    names.append(name.id)
    return names


IMMUTABLE = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    range,
    frozenset,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.ModuleType,
    types.MappingProxyType,
    enum.Enum,
    re.Pattern,
    logging.Logger,
    web.AppKey,
    web.RequestKey,
    contextvars.ContextVar,
    PurePath,
    dt.date,
    dt.time,
    dt.timedelta,
    typing.TypeVar,
    types.GenericAlias,
    types.UnionType,
)


def _immutable(value: Any) -> bool:
    if isinstance(value, types.MappingProxyType):
        return all(_immutable(v) for v in value.values())
    if isinstance(value, tuple | frozenset):
        return all(_immutable(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        frozen = type(value).__dataclass_params__.frozen  # type: ignore[attr-defined]
        return bool(frozen) and all(
            _immutable(getattr(value, f.name)) for f in dataclasses.fields(value)
        )
    if typing.get_origin(value) is not None or type(value).__module__ == "typing":
        return True  # a type alias (Callable[...], Literal[...], ...)
    if type(value) is object:
        return True  # a sentinel: it has no state to change
    return isinstance(value, IMMUTABLE) or (callable(value) and hasattr(value, "__wrapped__"))


MUTATORS = frozenset(
    "append extend insert update setdefault pop popitem clear add discard remove sort "
    "reverse __setitem__ __delitem__".split()
)


def _root(node: ast.expr) -> str | None:
    """The name an expression such as `A.b[c].d` starts from."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _changed(trees: list[ast.Module]) -> set[str]:
    """Every name some code changes in place (an item or attribute assigned or deleted
    through it, a mutating method called on it), or declares `global`."""
    changed = _declared_global(trees)
    for tree in trees:
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign | ast.Delete):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute | ast.Subscript):
                    changed.add(_root(target) or "")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
            ):
                changed.add(_root(node.func.value) or "")
    return changed


def _declared_global(trees: list[ast.Module]) -> set[str]:
    return {
        n for t in trees for node in ast.walk(t) if isinstance(node, ast.Global) for n in node.names
    }


def _globals_found() -> list[str]:
    modules = _modules()
    assert len(modules) > 40, [m for m, _ in modules]  # the whole package was found
    trees = [ast.parse(path.read_text(encoding="utf-8")) for _, path in modules]
    changed = _changed(trees)
    found: list[str] = []
    for module_name, path in modules:
        module = importlib.import_module(module_name)
        for name in _assigned(path):
            if name == "__all__" or name.startswith("__"):
                continue
            value = getattr(module, name)
            if _immutable(value):
                continue
            if type(value) in (dict, list, set) and name not in changed:
                continue  # a table nothing changes
            found.append(f"{module_name}.{name}: {type(value).__name__}")
    found += [f"global {name}" for name in sorted(_declared_global(trees))]
    return found


def test_no_module_of_the_package_keeps_mutable_state() -> None:
    found = _globals_found()
    assert not found, "module-level mutable state:\n" + "\n".join(found)


def test_the_check_sees_mutable_state() -> None:
    """The same judgement flags what it is there to flag."""

    @dataclasses.dataclass
    class Tally:
        n: int = 0

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        items: tuple[int, ...] = ()

    bad: object
    for bad in ({}, [], set(), Tally(), (1, []), types.MappingProxyType({"a": []})):
        assert not _immutable(bad), bad
    for good in ("x", 1, (1, "a"), frozenset({1}), Frozen((1,)), logging.getLogger("x")):
        assert _immutable(good), good
    tree = ast.parse(
        "TABLE = {}\nLIST = []\nKEPT = {}\n"
        "def f():\n    global N\n    TABLE['a'] = 1\n    LIST.append(2)\n    x = KEPT['a']\n"
    )
    assert _changed([tree]) >= {"TABLE", "LIST", "N"} and "KEPT" not in _changed([tree])
