"""docs/dbas.md's role table is what arm_core.devtools.roles_doc writes from the grants
of db/schema.sql: every function and column a role may use, and nothing it may not."""

from __future__ import annotations

import re

import pytest

from arm_core.devtools import generated, roles_doc


def test_the_role_table_is_what_the_grants_give() -> None:
    page = roles_doc.DOC_PATH.read_text(encoding="utf-8")
    expected = roles_doc.render(page, roles_doc.SCHEMA_PATH.read_text(encoding="utf-8"))
    assert page == expected, (
        f"docs/dbas.md's role table is stale: run `{roles_doc.REGENERATE}`\n"
        + generated.diff(page, expected, "docs/dbas.md", "db/schema.sql")
    )


def test_a_grant_shows_in_its_role_s_row_and_a_revoked_one_goes() -> None:
    schema = roles_doc.SCHEMA_PATH.read_text(encoding="utf-8")
    granted = schema + "GRANT ALL ON FUNCTION arm.sweep_timeouts() TO arm_api;\n"
    [row] = [r for r in roles_doc.render_table(granted).splitlines() if r.startswith("| `arm_api`")]
    assert "`sweep_timeouts`" in row
    revoked = schema.replace("GRANT ALL ON FUNCTION arm.retry_files_v2(", "-- (")
    [row] = [r for r in roles_doc.render_table(revoked).splitlines() if r.startswith("| `arm_api`")]
    assert "`retry_files_v2`" not in row and "`retry_file_v2`" in row


def test_a_role_without_a_line_is_refused() -> None:
    schema = roles_doc.SCHEMA_PATH.read_text(encoding="utf-8")
    with pytest.raises(SystemExit, match="arm_auditor"):
        roles_doc.render_table(
            schema + "GRANT ALL ON FUNCTION arm.get_file(uuid) TO arm_auditor;\n"
        )


def interface_calls(page: str) -> list[tuple[set[str], set[str]]]:
    """The SQL interface's block, paragraph by paragraph: the roles its `As …` comment
    names, and the arm. functions its statements call (paragraphs that call none left out)."""
    section = page.split("## The SQL interface", 1)[1].split("\n### ", 1)[0]
    block = section.split("```sql\n", 1)[1].split("```", 1)[0]
    found = []
    for paragraph in block.split("\n\n"):
        lines = paragraph.splitlines()
        comments = " ".join(line.removeprefix("--") for line in lines if line.startswith("--"))
        code = " ".join(line for line in lines if not line.startswith("--"))
        called = set(re.findall(r"\barm\.(\w+)\(", code))
        if called:
            said = re.search(r"\bAs (arm_\w+(?:\s*(?:,|or)\s+arm_\w+)*)", comments)
            assert said, f"no `As <role>` comment for {sorted(called)}"
            found.append((set(re.findall(r"arm_\w+", said[1])), called))
    return found


def test_the_sql_interface_says_who_may_run_each_call() -> None:
    """Each `As …` comment of docs/dbas.md's first block names exactly the roles
    db/schema.sql grants the calls below it (arm_owner, which owns them, always)."""
    page = roles_doc.DOC_PATH.read_text(encoding="utf-8")
    granted = roles_doc.grants(roles_doc.SCHEMA_PATH.read_text(encoding="utf-8"))
    paragraphs = interface_calls(page)
    assert len(paragraphs) >= 5, paragraphs
    for said, called in paragraphs:
        for function in called:
            may = {"arm_owner"} | {r for r, g in granted.items() if function in g["functions"]}
            assert said == may, f"dbas.md says {sorted(said)} may call {function}: {sorted(may)}"
