"""docs/dbas.md's table of database roles, from the grants a migrated database has.

The table sits between two marker lines of the page; everything else on the page is
written by hand. What each role may do comes from the GRANT statements of db/schema.sql
(a migrated database's own dump, held current by its test), so the table cannot say what
db/grants.sql does not grant. Who each role is for is written here, in ROLES.

    python -m arm_core.devtools.roles_doc --write   # rewrite the table in docs/dbas.md
    python -m arm_core.devtools.roles_doc --check   # exit 1 with a diff when stale
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Sequence

from arm_core.devtools import generated

DOC_PATH = generated.CHECKOUT / "docs" / "dbas.md"
SCHEMA_PATH = generated.CHECKOUT / "db" / "schema.sql"
REGENERATE = "python -m arm_core.devtools.roles_doc --write"
BEGIN = (
    "<!-- The role table is generated from db/schema.sql's grants by "
    f"`{REGENERATE}`: edit ROLES there, not here. -->"
)
END = "<!-- End of the generated role table. -->"

# Who each role is for, in the table's order. arm_owner is granted nothing: it owns.
ROLES = {
    "arm_owner": "the migrating user (migrate makes it a member), DBAs",
    "arm_bridge": "`arm-core bridge`; `serve` with `NATS_ENABLED=true` (with `arm_api`)",
    "arm_api": "`arm-core serve`",
    "arm_uploader": "upstream's upload service ([Uploading a file](#uploading-a-file))",
    "arm_readonly": "DBAs, dashboards",
}
OWNER = (
    "owns schema `arm`, its tables and functions: everything, `arm.periodic_task` and "
    "`arm.setting` included"
)

GRANT = re.compile(
    r"^GRANT (?P<privs>.+?) ON (?P<kind>SCHEMA|TABLE|FUNCTION) (?P<what>.+) TO (?P<role>\w+);$"
)
PRIVILEGE = re.compile(r"(\w+)(?:\(([^)]*)\))?")


def grants(schema: str) -> dict[str, dict[str, set[str]]]:
    """role → {"functions": names, "<table>": privileges ("SELECT" or "INSERT (a, b)")}."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    columns: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for line in schema.splitlines():
        m = GRANT.match(line)
        if m is None or m["kind"] == "SCHEMA":
            continue
        role = m["role"]
        if m["kind"] == "FUNCTION":
            found[role]["functions"].add(m["what"].split("(")[0].removeprefix("arm."))
            continue
        table = m["what"].removeprefix("arm.")
        for priv, cols in PRIVILEGE.findall(m["privs"]):
            if cols:
                columns[(role, table, priv)].append(cols)
            else:
                found[role][table].add(priv)
    for (role, table, priv), cols in columns.items():
        found[role][table].add(f"{priv} ({', '.join(cols)})")
    return found


def tables(schema: str) -> set[str]:
    return set(re.findall(r"^CREATE TABLE arm\.(\w+)", schema, re.M))


def may(role: str, granted: dict[str, set[str]], every_table: set[str]) -> str:
    parts = []
    if functions := sorted(granted.get("functions", ())):
        parts.append("call " + ", ".join(f"`{f}`" for f in functions))
    on = {t: p for t, p in granted.items() if t != "functions"}
    if set(on) == every_table and all(p == {"SELECT"} for p in on.values()):
        parts.append("`SELECT` on every table of `arm`")
    else:
        for table in sorted(on):
            privileges = " · ".join(f"`{p}`" for p in sorted(on[table]))
            parts.append(f"{privileges} on `{table}`")
    return "; ".join(parts)


def render_table(schema: str) -> str:
    found = grants(schema)
    unknown = sorted(set(found) - set(ROLES))
    if unknown:
        raise SystemExit(f"roles_doc.ROLES: no line for the roles {unknown}")
    every_table = tables(schema)
    lines = ["| role | may | for |", "| --- | --- | --- |"]
    for role, users in ROLES.items():
        text = OWNER if role == "arm_owner" else may(role, found.get(role, {}), every_table)
        lines.append(f"| `{role}` | {text} | {users} |")
    return "\n".join(lines) + "\n"


def render(page: str, schema: str) -> str:
    """`page` with the table between its markers replaced by the one `schema` grants."""
    return generated.replace_between(page, BEGIN, END, render_table(schema), "docs/dbas.md")


def main(argv: Sequence[str] | None = None) -> int:
    return generated.main(
        argv,
        prog="python -m arm_core.devtools.roles_doc",
        description="docs/dbas.md's role table from db/schema.sql's grants.",
        path=DOC_PATH,
        render=lambda: render(
            DOC_PATH.read_text(encoding="utf-8"), SCHEMA_PATH.read_text(encoding="utf-8")
        ),
        source="db/schema.sql's grants",
        regenerate=REGENERATE,
    )


if __name__ == "__main__":
    sys.exit(main())
