"""The one environment parser: a dataclass declares each variable with :func:`env_var`
(its name, a parser, its default) and :func:`read_env` reads them all.

:class:`arm_core.config.Settings` is one such dataclass; the dev tools' ``REFERENCE_*``
configuration (arm_core.devtools.reference) is another, with the same parsers
(:func:`parse_bool`, :func:`number`, :func:`one_of`, :func:`text`). A bad value raises
:class:`ConfigError` whose message names the variable.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, TypeVar

from arm_core.config_error import ConfigError

N = TypeVar("N", int, float)

# A parser takes the variable's name and its raw value; it returns the value or raises
# ConfigError naming the variable (never quoting a secret's value).
Parser = Callable[[str, str], Any]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}: expected true or false, got {raw!r}")


def number(kind: Callable[[str], N], minimum: float | None = None) -> Callable[[str, str], N]:
    """An int or float parser; nan and inf are not numbers here."""

    def parse(name: str, raw: str) -> N:
        try:
            value = kind(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}: expected a number, got {raw!r}") from None
        if not math.isfinite(value):
            raise ConfigError(f"{name}: expected a number, got {raw!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(f"{name}: must be at least {minimum}, got {raw!r}")
        return value

    return parse


def one_of(
    options: tuple[str, ...], fold: Callable[[str], str] = str.lower
) -> Callable[[str, str], str]:
    """One of `options`, compared after stripping and `fold` (lower-case by default)."""

    def parse(name: str, raw: str) -> str:
        value = fold(raw.strip())
        if value not in options:
            raise ConfigError(f"{name}: expected one of {', '.join(options)}, got {raw!r}")
        return value

    return parse


def text(name: str, raw: str) -> str:
    """Any text, stripped; the one parser for which an empty value counts as given."""
    return raw.strip()


def env_var(env: str, parse: Parser, default: Any) -> Any:
    """A dataclass field read from the environment variable `env` by :func:`read_env`."""
    return field(default=default, metadata={"env": env, "parse": parse})


def read_env(cls: type, env: Mapping[str, str]) -> tuple[dict[str, Any], frozenset[str]]:
    """The :func:`env_var` fields of dataclass `cls` that `env` gives, parsed (by field
    name), and the names of the variables given. A blank value counts as not given,
    except for :func:`text`. Raises ConfigError naming the first bad variable."""
    values: dict[str, Any] = {}
    given: set[str] = set()
    for f in dataclasses.fields(cls):
        name = f.metadata.get("env")
        if name is None:
            continue
        raw = env.get(name)
        if raw is None or (raw.strip() == "" and f.metadata["parse"] is not text):
            continue
        values[f.name] = f.metadata["parse"](name, raw)
        given.add(name)
    return values, frozenset(given)
