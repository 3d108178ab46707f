"""docs/logs-and-metrics.md's table of log actions is what arm_core.devtools.actions_doc
writes: every action the code logs, each with its meaning, and no other."""

from __future__ import annotations

from arm_core.devtools import actions_doc, generated


def test_every_action_the_code_logs_has_a_meaning_and_no_meaning_is_left_over() -> None:
    found = set(actions_doc.actions_in_code())
    assert found - set(actions_doc.ACTIONS) == set(), "logged, but not in ACTIONS"
    assert set(actions_doc.ACTIONS) - found == set(), "in ACTIONS, but logged nowhere"


def test_the_page_holds_the_table_the_code_writes() -> None:
    page = actions_doc.DOC_PATH.read_text(encoding="utf-8")
    expected = actions_doc.render(page)
    assert page == expected, (
        f"docs/logs-and-metrics.md's action table is stale: run `{actions_doc.REGENERATE}`\n"
        + generated.diff(page, expected, "docs/logs-and-metrics.md", "the code")
    )


def test_each_way_the_code_names_an_action_is_found() -> None:
    """A field, a keyword, an assignment (either branch), a helper's argument; an
    argparse action is not a log's."""
    source = (
        'log.info("x", extra={"action": "one"})\n'
        'record.__dict__.update(action="two")\n'
        'action = "three" if ok else "four"\n'
        'log.info("y", extra=_envelope(envelope, "five"))\n'
        'parser.add_argument("--v", action="store_true")\n'
    )
    found = actions_doc.actions_in_source(source, "module")
    assert found == {"one", "two", "three", "four", "five"}
