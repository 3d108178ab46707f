"""docs/dbas.md's role table is what arm_core.devtools.roles_doc writes from the grants
of db/schema.sql: every function and column a role may use, and nothing it may not."""

from __future__ import annotations

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
