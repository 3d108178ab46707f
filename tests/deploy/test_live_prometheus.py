"""The alert rules against a real Prometheus (Debian package `prometheus`) scraping a
real `arm-core serve` (with a token of level metrics, as a deployment scrapes it) and
`arm-core bridge`.

Prometheus runs as the test's own process on a free loopback port, scraping every second
and evaluating the shipped rules (deploy/prometheus/arm-core-rules.yml) with their `for:`
durations and the outbox's age threshold shortened — the expressions, labels and
annotations are the shipped ones; only the waits are seconds instead of minutes.

- nats-server stopped: `ArmCoreNatsDisconnected` fires for the bridge, and resolves once
  the server is back;
- the outbox blocked (a DBA's transaction holds the queued jobs' rows, the publisher skips
  them) while NATS is connected: `ArmCoreOutboxStuck` fires, and resolves once released;
- every series selector in the rules returns a series from the live targets (a misspelt
  metric or label value would return none), every rule expression evaluates without
  error, and every query of the Grafana dashboard (deploy/grafana/arm-core.json)
  returns series."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, running_stack
from arm_core.devtools.testbed.sql import upload_many
from tests.support.tls import Pki

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "arm-core-rules.yml"
DASHBOARD = DEPLOY / "grafana" / "arm-core.json"
METRICS_TOKEN = "prometheus-scrape-t0ken-0123"
VIEWER_TOKEN = "ivanova-viewer-t0ken-0123"


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of deploy/grafana/arm-core.json."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def shortened_rules(directory: Path) -> Path:
    """The shipped rules with every `for:` at 2 s and the outbox threshold at 3 s."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "2s"
            if rule.get("alert") == "ArmCoreOutboxStuck":
                assert "> 120" in rule["expr"]
                rule["expr"] = rule["expr"].replace("> 120", "> 3")
    path = directory / "rules.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Prometheus:
    def __init__(
        self, directory: Path, targets: dict[str, str], tokens: dict[str, Path] | None = None
    ) -> None:
        """Scrapes each job's target, with `Authorization: Bearer` and the token in the
        file `tokens[job]` where given (as a deployment keeps it: a file, not the config)."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(shortened_rules(directory))],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [{"targets": [target]}],
                    **(
                        {"authorization": {"type": "Bearer", "credentials_file": str(tokens[job])}}
                        if tokens and job in tokens
                        else {}
                    ),
                }
                for job, target in targets.items()
            ],
        }
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (directory / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=self.log,
        )

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The firing alerts named `name`."""
        found = self.get("/api/v1/alerts")["alerts"]
        return [a for a in found if a["labels"]["alertname"] == name and a["state"] == "firing"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def prometheus_needed() -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Iterator[Stack]:
    """The suite's stack with JetStream, so the bridge runs on the results stream and
    exports what the stream's alert reads."""
    yield from running_stack(db_url, tmp_path, ["-js", "-sd", str(tmp_path / "js")])


@pytest.fixture
def watched(prometheus_needed: None, stack: Stack, tmp_path: Path) -> Iterator[Prometheus]:
    bridge_port = free_port()
    # A CA bundle in DATABASE_URL (libpq's sslrootcert; sslmode=prefer falls back to the
    # suite's plain server) gives the bridge a certificate expiry to export.
    ca = Pki(tmp_path / "pki").ca_file
    url = f"{stack.db_url}?sslmode=prefer&sslrootcert={ca}"
    stack.start(
        "bridge", BRIDGE_HEALTH_PORT=bridge_port, DATABASE_URL=url, RESULTS_STREAM="ARM_RESULTS"
    ).wait_healthy(bridge_port)
    # The API asks for a token; Prometheus holds one of level metrics, which may read
    # /metrics and nothing else (a viewer's token may not scrape).
    _, serve_url = stack.serve(
        NATS_ENABLED="false",
        AUTH_MODE="token",
        API_TOKENS=f"prometheus:metrics={METRICS_TOKEN},ivanova:viewer={VIEWER_TOKEN}",
    )
    assert scrape_status(serve_url, VIEWER_TOKEN) == 403
    assert scrape_status(serve_url, None) == 401
    token_file = tmp_path / "arm-core-metrics-token"
    token_file.write_text(METRICS_TOKEN)
    prometheus = Prometheus(
        tmp_path,
        {
            "arm-core-bridge": f"127.0.0.1:{bridge_port}",
            "arm-core-serve": serve_url.removeprefix("http://"),
        },
        tokens={"arm-core-serve": token_file},
    )
    try:
        yield prometheus
    finally:
        prometheus.stop()


def scrape_status(base: str, token: str | None) -> int:
    """The status of GET /metrics with this bearer token (None: no credentials)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{base}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def selectors(expr: str) -> list[str]:
    """The series selectors of a PromQL expression: a metric name with its matchers."""
    return re.findall(r"\b((?:arm_[a-z_]+|up)(?:\{[^}]*\})?)", expr)


async def test_alerts_fire_and_resolve_against_a_live_prometheus(
    watched: Prometheus, stack: Stack
) -> None:
    prometheus = watched
    await wait_for(prometheus.ready, 30, "prometheus ready")

    def firing(name: str) -> bool:
        return bool(prometheus.alerts(name))

    def scraped() -> bool:
        targets = prometheus.get("/api/v1/targets")["activeTargets"]
        return len(targets) == 2 and all(t["health"] == "up" for t in targets)

    await wait_for(scraped, 30, lambda: f"both targets up: {prometheus.get('/api/v1/targets')}")
    # The sweep has run (its gauges exist from then on), and nothing fires on a quiet
    # system but what needs traffic to be judged.
    await wait_for(
        lambda: bool(prometheus.get("/api/v1/query", query="arm_schedule_last_sweep_ok")["result"]),
        30,
        "the sweep's gauges scraped",
    )

    # Every selector of every rule names a series the targets export.
    doc = yaml.safe_load(RULES.read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    for rule in rules:
        for selector in selectors(rule["expr"]):
            result = prometheus.get("/api/v1/query", query=selector)["result"]
            assert result, f"{rule.get('alert') or rule.get('record')}: {selector} selects nothing"
        prometheus.get("/api/v1/query", query=rule["expr"])  # evaluates (status success)

    # Every query of the dashboard returns series (the recording rules have been
    # evaluated: their series exist once two scrapes are in).
    queries = dashboard_queries()
    assert len(queries) >= 15

    def answered(expr: str) -> bool:
        return bool(prometheus.get("/api/v1/query", query=expr)["result"])

    for title, expr in queries:
        await wait_for(functools.partial(answered, expr), 30, f"dashboard {title!r}: {expr}")

    # NATS stopped: the bridge's alert fires. Uploads meanwhile wait in the outbox, but
    # that is NATS's alert, not the outbox's.
    stack.nats.stop()
    await wait_for(lambda: firing("ArmCoreNatsDisconnected"), 60, "NATS alert firing")
    [alert] = prometheus.alerts("ArmCoreNatsDisconnected")
    assert alert["labels"]["job"] == "arm-core-bridge"
    assert alert["annotations"]["runbook_url"] == "docs/runbooks.md#armcorenatsdisconnected"
    with psycopg.connect(stack.db_url, autocommit=True) as dba:
        upload_many(dba, 3)
        old = "max(arm_outbox_oldest_ready_age_seconds) > 6"
        await wait_for(
            lambda: bool(prometheus.get("/api/v1/query", query=old)["result"]), 60, "an old queue"
        )
        assert prometheus.alerts("ArmCoreOutboxStuck") == []
        # A DBA's transaction holds the queued jobs' rows (the publisher skips locked
        # rows): once NATS is back the outbox stays stuck while NATS is connected.
        with dba.transaction():
            dba.execute("SELECT id FROM arm.recognition_job WHERE status = 'queued' FOR UPDATE")
            stack.nats.start()
            await wait_for(
                lambda: not prometheus.alerts("ArmCoreNatsDisconnected"), 60, "NATS resolved"
            )
            await wait_for(lambda: firing("ArmCoreOutboxStuck"), 60, "outbox alert")
            [alert] = prometheus.alerts("ArmCoreOutboxStuck")
            assert "ready to publish" in alert["annotations"]["summary"]
        # Released: the publisher sends them, the age falls to 0, the alert resolves.
        await wait_for(lambda: not prometheus.alerts("ArmCoreOutboxStuck"), 60, "outbox resolved")
