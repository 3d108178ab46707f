"""Every relative link of the README and of docs/ leads somewhere.

The README is an entry page and the reference lives in docs/, so most of what a reader
follows is a relative link. Each one — a Markdown link or image, `[text](target)` and
`![alt](target)`, outside code — must name a file or directory that exists, and a
`#anchor` on a Markdown page (or a bare `#anchor` on the same page) must be one of that
page's headings, slugged as GitHub slugs them, or an explicit `<a id="…">`. Links to
http(s) and mailto are not checked.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) or ![alt](target), the target optionally in <…> and followed by a title.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s()]+)(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"""<a\s+(?:[^>]*\s)?(?:id|name)\s*=\s*["']([^"']+)["']""")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (those become empty lines)."""
    lines, fenced = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fenced is None and m:
            fenced = m.group(1)
            lines.append("")
        elif fenced is not None:
            if line.lstrip().startswith(fenced):
                fenced = None
            lines.append("")
        else:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lower case, every
    character but letters, digits, `_`, `-` and spaces dropped, spaces as `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    text = page.read_text(encoding="utf-8")
    found: set[str] = set(EXPLICIT_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for line in prose_lines(text):
        m = HEADING.match(line)
        if m is None:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link on the page outside code."""
    found = []
    for number, line in enumerate(prose_lines(page.read_text(encoding="utf-8")), 1):
        for m in LINK.finditer(INLINE_CODE.sub("code", line)):
            found.append((number, m.group(1).strip("<>")))
    return found


def broken(page: Path, target: str) -> str | None:
    """Why `target`, linked from `page`, leads nowhere; None when it leads somewhere."""
    path_part, _, anchor = target.partition("#")
    dest = (page.parent / unquote(path_part)).resolve() if path_part else page
    if not dest.exists():
        return f"{path_part} does not exist"
    if not dest.resolve().is_relative_to(ROOT):
        return f"{path_part} is outside the repository"
    if anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
        return f"{dest.relative_to(ROOT)} has no heading or <a id> for #{anchor}"
    return None


def test_the_pages_have_links_to_check() -> None:
    """A guard for the check below: a scan that found no links would pass it."""
    readme = links(ROOT / "README.md")
    targets = {t for _, t in readme}
    assert "docs/console.png" in targets, "the README's picture is not found as an image"
    assert any(t.startswith("docs/") and t.endswith(".md") for t in targets)
    assert len(pages()) > 5


def test_every_relative_link_leads_somewhere() -> None:
    problems = [
        f"{page.relative_to(ROOT)}:{number}: ({target}): {why}"
        for page in pages()
        for number, target in links(page)
        if not EXTERNAL.match(target)
        for why in [broken(page, target)]
        if why is not None
    ]
    assert not problems, "links that lead nowhere:\n" + "\n".join(problems)


def test_slugs_follow_github() -> None:
    assert slug("What `make run` shows") == "what-make-run-shows"
    assert slug("The schedule with no bridge running: pg_cron") == (
        "the-schedule-with-no-bridge-running-pg_cron"
    )
    assert slug("The whole stack: compose.yaml") == "the-whole-stack-composeyaml"
    assert slug("For operators: the console") == "for-operators-the-console"
    assert slug("Every command (`arm_core.config.Settings`)") == (
        "every-command-arm_coreconfigsettings"
    )
