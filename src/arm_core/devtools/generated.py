"""Files the repository keeps as generated output (db/schema.sql, docs/configuration.md):
one way to write them, check them against their source, or print them."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

# The source checkout, whose files these are: this module is src/arm_core/devtools/ of it.
# resolve() matters: the editable install (editable_mode=strict) loads the package from
# links in build/__editable__.*/arm_core, and resolving this file's link leads back to
# the checkout. A package installed from a wheel has no checkout: --write and --check
# refuse (below).
CHECKOUT = Path(__file__).resolve().parents[3]


def diff(expected: str, actual: str, expected_name: str, actual_name: str) -> str:
    """A unified diff of two renderings ('' when they are equal)."""
    return "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=expected_name,
            tofile=actual_name,
        )
    )


def write_or_check(
    path: Path, actual: str, *, write: bool, check: bool, source: str, regenerate: str
) -> bool:
    """--write rewrites `path`; --check prints the diff against it and says how to
    regenerate it when it is stale; neither prints `actual`. True when --check found it
    stale."""
    name = f"{path.parent.name}/{path.name}"
    if (write or check) and not path.parent.is_dir():
        raise SystemExit(f"{name}: no {path.parent} here; --write and --check need a checkout")
    if write:
        path.write_text(actual, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    elif check:
        expected = path.read_text(encoding="utf-8") if path.exists() else ""
        changes = diff(expected, actual, name, source)
        if changes:
            sys.stdout.write(changes)
            print(f"{name} is stale: regenerate it with `{regenerate}`", file=sys.stderr)
            return True
        print(f"{name} is up to date", file=sys.stderr)
    else:
        sys.stdout.write(actual)
    return False


def replace_between(page: str, begin: str, end: str, content: str, name: str) -> str:
    """`page` with what lies between its lines `begin` and `end` replaced by `content`
    (a blank line either side): a generated part of a page written by hand."""
    before, found_begin, rest = page.partition(begin + "\n")
    _, found_end, after = rest.partition(end)
    if not found_begin or not found_end:
        raise SystemExit(f"{name}: no generated part between the lines {begin!r} and {end!r}")
    return before + begin + "\n\n" + content + "\n" + end + after


def main(
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    path: Path,
    render: Callable[[], str],
    source: str,
    regenerate: str,
) -> int:
    """The command line of a generator: --write, --check (exit 1 when stale) or print."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite {path.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when stale")
    args = parser.parse_args(argv)
    stale = write_or_check(
        path, render(), write=args.write, check=args.check, source=source, regenerate=regenerate
    )
    return 1 if stale else 0
