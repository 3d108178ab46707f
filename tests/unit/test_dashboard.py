"""The Grafana dashboard (deploy/grafana/arm-core.json) shows the series behind every alert
of deploy/prometheus/arm-core-rules.yml, directly or through a recording rule, so the
dashboard an operator opens first has a picture of whatever fired; and its panels are
laid out without overlapping. (tests/deploy/test_live_prometheus.py runs each of its
queries against a live Prometheus.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERIES = re.compile(r"\b(arm[_:][A-Za-z0-9_:]+|up)\b")


def dashboard() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = json.loads(
        (DEPLOY / "grafana" / "arm-core.json").read_text(encoding="utf-8")
    )["panels"]
    return panels


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "arm-core-rules.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def shown() -> set[str]:
    """The series the dashboard's queries read, and those its recording rules read."""
    recorded = {r["record"]: r["expr"] for r in rules() if "record" in r}
    names = {
        n for p in dashboard() for t in p.get("targets", []) for n in SERIES.findall(t["expr"])
    }
    return names | {n for name in names if name in recorded for n in SERIES.findall(recorded[name])}


def test_every_alerts_series_is_on_the_dashboard() -> None:
    on_it = shown()
    missing = {
        rule["alert"]: sorted(set(SERIES.findall(rule["expr"])) - on_it)
        for rule in rules()
        if "alert" in rule and set(SERIES.findall(rule["expr"])) - on_it
    }
    assert not missing, f"alerts whose series no dashboard panel shows: {missing}"


def test_the_panels_have_their_own_ids_and_places() -> None:
    panels = dashboard()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    taken: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{p['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = p["title"]
