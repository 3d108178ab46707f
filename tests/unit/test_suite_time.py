"""make test-durations reads which worker ran each test and when from the JUnit report
(tests/conftest.py records them), and says when each worker ran out of work."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from benchmarks.suite_time import worker_lines, workers_of

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" time="30.0">
<testcase classname="tests.e2e.test_a" name="test_long" time="20.0">
  <properties><property name="worker" value="gw0"/><property name="started" value="1000.0"/>
  </properties></testcase>
<testcase classname="tests.unit.test_b" name="test_short" time="2.0">
  <properties><property name="worker" value="gw1"/><property name="started" value="1001.0"/>
  </properties></testcase>
<testcase classname="tests.unit.test_b" name="test_later" time="3.0">
  <properties><property name="worker" value="gw1"/><property name="started" value="1004.0"/>
  </properties></testcase>
<testcase classname="tests.unit.test_c" name="test_without_properties" time="1.0"/>
</testsuite></testsuites>
"""


def test_each_workers_busy_time_end_and_last_test() -> None:
    junit = ET.fromstring(REPORT)
    found = workers_of(junit)
    assert sorted(found) == ["gw0", "gw1"]
    assert (found["gw0"].busy, found["gw0"].last) == (20.0, 1020.0)
    assert (found["gw1"].busy, found["gw1"].last, found["gw1"].last_test) == (
        5.0,
        1007.0,
        "test_b::test_later",
    )
    rows = [line for line in worker_lines(junit) if line.startswith("| gw")]
    # Ordered by when each ran out of work, in seconds from the first test's start.
    assert rows == [
        "| gw1 | 5 | 7 | `test_b::test_later` |",
        "| gw0 | 20 | 20 | `test_a::test_long` |",
    ]


def test_a_report_without_the_properties_has_no_worker_table() -> None:
    junit = ET.fromstring(REPORT.replace('name="worker"', 'name="other"'))
    assert worker_lines(junit) == []
