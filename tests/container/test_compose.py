"""compose.yaml, the production shape on one machine: read as compose reads it (every
arm-core service runs a real command with variables arm-core reads, two identical
bridges, no runtime process as the superuser), and run by podman-compose on local
images standing in for the official postgres and nats ones (tests/support/compose.py,
arm_core.devtools.testbed.images):
the stack comes up, an upload reaches `done`, and `down -v` leaves nothing behind.

The figures (`podman-compose up` → every service healthy, upload → done) are printed by
the test that measures them (`pytest -s tests/container/test_compose.py`)."""

from __future__ import annotations

import copy
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.images import REPO, nats_image, postgres_image
from arm_core.devtools.testbed.polling import wait_for_sync
from arm_core.devtools.testbed.sql import dict_conn, scalar, upload
from tests.support.compose import (
    ComposeProject,
    command_of,
    compose_missing,
    environment,
    header,
    interpolate,
    is_arm_core,
    load,
    problems,
    variables,
)

# The services compose.yaml runs from the arm-core image, and what each runs.
ARM_CORE_SERVICES = {
    "migrate": "migrate",
    "serve": "serve",
    "bridge-1": "bridge",
    "bridge-2": "bridge",
    "reference": "reference",
}
LONG_RUNNING = ("serve", "bridge-1", "bridge-2", "reference")
ONE_SHOTS = ("migrate", "logins")

# The stack is asked through podman: a poll every quarter second, not every 50 ms.
POLL = 0.25


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load()


@pytest.fixture(scope="module")
def defaults(compose: dict[str, Any]) -> dict[str, Any]:
    """The file as it runs with nothing set in the environment."""
    resolved: dict[str, Any] = interpolate(compose, {})
    return resolved


def test_the_arm_core_services_run_real_commands_with_variables_arm_core_reads(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    found = {name: command_of(s)[0] for name, s in services.items() if is_arm_core(s)}
    assert found == ARM_CORE_SERVICES
    assert problems(compose) == []
    for name in ARM_CORE_SERVICES:
        build = services[name]["build"]
        assert (REPO / build["context"] / build["dockerfile"]).is_file(), name


def test_a_misspelled_variable_or_command_is_caught(compose: dict[str, Any]) -> None:
    """The check above fails on what a typo in compose.yaml would be."""
    misspelled = copy.deepcopy(compose)
    misspelled["services"]["serve"]["environment"]["DATABSE_URL"] = "postgresql://x@y/z"
    misspelled["services"]["bridge-2"]["environment"] = [
        *(f"{k}={v}" for k, v in environment(misspelled["services"]["bridge-2"]).items()),
        "OUTBOX_POLL_SECOND=1",
    ]
    misspelled["services"]["migrate"]["command"] = ["migrat"]
    misspelled["services"]["reference"]["healthcheck"]["test"] = ["CMD", "arm-core", "health"]
    # REFERENCE_* are the reference services' alone.
    misspelled["services"]["bridge-1"]["environment"] = {"REFERENCE_MODE": "fail"}
    assert problems(misspelled) == [
        "migrate: command ['migrat'] is not an arm-core command",
        "serve: arm-core serve reads no DATABSE_URL",
        "bridge-1: arm-core bridge reads no REFERENCE_MODE",
        "bridge-2: arm-core bridge reads no OUTBOX_POLL_SECOND",
        "reference: healthcheck ['CMD', 'arm-core', 'health'] is not `arm-core healthcheck`",
    ]


def test_two_bridges_that_differ_only_by_name(defaults: dict[str, Any]) -> None:
    services = defaults["services"]
    bridges = [name for name, s in services.items() if command_of(s)[:1] == ["bridge"]]
    assert bridges == ["bridge-1", "bridge-2"]
    assert services["bridge-1"] == services["bridge-2"]
    assert "container_name" not in services["bridge-1"]
    # One queue group (the default) and one durable consumer of the results stream.
    env = environment(services["bridge-1"])
    assert "NATS_QUEUE_GROUP" not in env and env["RESULTS_STREAM"]


def _login_roles(defaults: dict[str, Any]) -> dict[str, tuple[set[str], str]]:
    """login → (the group roles the logins service grants it, its password), read from
    that service's SQL and environment."""
    logins = defaults["services"]["logins"]
    script = "\n".join(str(word) for word in logins["command"])
    env = environment(logins)
    getenv = dict(re.findall(r"\\getenv (\w+) (\w+)", script))
    found: dict[str, tuple[set[str], str]] = {}
    for login, psql_var in re.findall(r"ALTER ROLE (\w+) LOGIN PASSWORD :'(\w+)'", script):
        granted = set(re.findall(rf"GRANT (\w+) TO {login};", script))
        found[login] = (granted, env[getenv[psql_var]])
    return found


def test_serve_and_the_bridges_connect_as_their_own_logins_not_the_superuser(
    defaults: dict[str, Any],
) -> None:
    services = defaults["services"]
    postgres = environment(services["postgres"])
    superuser = postgres["POSTGRES_USER"]
    logins = _login_roles(defaults)
    assert superuser not in logins
    for name in ("serve", "bridge-1", "bridge-2"):
        env = environment(services[name])
        url = urlsplit(env["DATABASE_URL"])
        assert url.username != superuser, f"{name} connects as the superuser"
        assert url.hostname == "postgres" and url.path == f"/{postgres['POSTGRES_DB']}"
        granted, password = logins[str(url.username)]
        assert url.password == password, f"{name}: not the password its login is given"
        # serve with the bridge in it (NATS_ENABLED true) would need arm_bridge too.
        needs = {"bridge": {"arm_bridge"}, "serve": {"arm_api"}}[command_of(services[name])[0]]
        if command_of(services[name])[0] == "serve" and env.get("NATS_ENABLED") != "false":
            needs |= {"arm_bridge"}
        assert granted == needs, f"{name}: its login has {granted}, it needs {needs}"
    # Only migrate, which creates the roles, runs as the superuser.
    migrate = urlsplit(environment(services["migrate"])["DATABASE_URL"])
    assert (migrate.username, migrate.password) == (superuser, postgres["POSTGRES_PASSWORD"])
    # Upstream's uploads have a login too.
    assert logins["upload_login"][0] == {"arm_uploader"}


def test_it_runs_as_it_is_and_publishes_on_loopback_only(
    compose: dict[str, Any], defaults: dict[str, Any]
) -> None:
    used = variables(compose)
    # One default per variable: the superuser's password in postgres' environment and in
    # migrate's URL, a login's in the logins service and in its process' URL.
    assert {name: defaults for name, defaults in used.items() if len(defaults) != 1} == {}
    without_default = sorted(name for name, defaults in used.items() if None in defaults)
    assert without_default == [], "every ${…} needs a default (the file runs as it is)"
    # What an operator may set is named where they read first.
    assert sorted(name for name in used if name not in header()) == []
    for name, service in defaults["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} off loopback"


def test_start_order_and_restarts(compose: dict[str, Any]) -> None:
    """depends_on with conditions for docker compose; `restart: on-failure` for tools
    that ignore them (podman-compose 1.0 starts everything at once)."""
    services = compose["services"]
    for name, service in services.items():
        for dependency, spec in (service.get("depends_on") or {}).items():
            condition = spec["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], (name, dependency)
            elif condition == "service_completed_successfully":
                assert dependency in ONE_SHOTS, (name, dependency)
            else:
                assert condition == "service_started", (name, condition)
    for name in (*LONG_RUNNING, *ONE_SHOTS):
        assert services[name]["restart"] == "on-failure", name
    assert services["serve"]["healthcheck"]["test"] == ["CMD", "arm-core", "healthcheck"]


# --- the stack, run ---------------------------------------------------------------------


def _get(url: str, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


@pytest.mark.e2e
def test_the_stack_comes_up_under_podman_compose_and_an_upload_reaches_done(
    image: str, tmp_path: Path
) -> None:
    reason = compose_missing()
    if reason is not None:
        pytest.skip(reason)
    http_port, pg_port = free_port(), free_port()
    project = ComposeProject(
        {
            "ARM_CORE_IMAGE": image,
            "POSTGRES_IMAGE": postgres_image(),
            "NATS_IMAGE": nats_image(),
            "ARM_HTTP_PORT": str(http_port),
            "POSTGRES_HOST_PORT": str(pg_port),
        },
        tmp_path,
    )
    defaults = interpolate(load(), {})["services"]
    superuser = environment(defaults["postgres"])
    db = f"127.0.0.1:{pg_port}/{superuser['POSTGRES_DB']}"
    admin_url = f"postgresql://{superuser['POSTGRES_USER']}:{superuser['POSTGRES_PASSWORD']}@{db}"
    uploader = environment(defaults["logins"])["ARM_UPLOADER_DB_PASSWORD"]
    token = environment(defaults["serve"])["API_TOKENS"].split(",")[0].split("=", 1)[1]

    def everything_up() -> bool:
        return (
            all(project.exited_ok(s) for s in ONE_SHOTS)
            and all(project.healthy(s) for s in ("postgres", "serve", "bridge-1", "bridge-2"))
            and all(project.state(s)["Running"] for s in ("nats", "reference"))
        )

    try:
        project.up()
        began = project.started_at
        wait_for_sync(everything_up, 180, project.all_logs, every=POLL)
        up_in = time.monotonic() - began
        restarts = {s: project.restarts(s) for s in (*ONE_SHOTS, *LONG_RUNNING)}
        print(f"\nFIGURE podman-compose up → every service healthy: {up_in:.1f} s "
              f"(restarts on failure while waiting: {restarts})")  # fmt: skip

        # The logins service again: nothing to create, passwords set again, exit 0.
        first_run = project.state("logins")["StartedAt"]
        again = project.compose("start", "logins")
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        wait_for_sync(
            lambda: project.state("logins")["StartedAt"] != first_run
            and project.exited_ok("logins"),
            60, lambda: project.logs("logins"), every=POLL,
        )  # fmt: skip

        # Upstream's upload, as its own login through the published port.
        with dict_conn(f"postgresql://upload_login:{uploader}@{db}") as conn:
            up = upload(conn, "XLSX")
        began = time.monotonic()
        with dict_conn(admin_url) as conn:
            took = wait_for_sync(
                lambda: scalar(conn, "SELECT status::text FROM arm.recognition_job "
                               "WHERE id = %s", (up.job_id,)) == "done",
                60, project.all_logs, every=POLL,
            )  # fmt: skip
            print(f"FIGURE upload → done through the compose stack: {took:.2f} s")
            # Who the arm-core processes are to the database: their logins, never the
            # superuser; two bridges, each from its own container.
            sessions = conn.execute(
                "SELECT usename, count(DISTINCT client_addr) AS hosts FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
                "GROUP BY usename"
            ).fetchall()
        assert {row["usename"]: row["hosts"] for row in sessions} == {
            "api_login": 1,
            "bridge_login": 2,
        }

        # The try-out of docs/containers.md: deploy/demo-upload.sql as upload_login, four
        # files, three recognised and the one marked [fail] failed.
        demo = (Path(__file__).resolve().parents[2] / "deploy" / "demo-upload.sql").read_text(
            encoding="utf-8"
        )
        with dict_conn(f"postgresql://upload_login:{uploader}@{db}") as conn:
            rows = conn.execute(demo).fetchall()
        assert [r["n"] for r in rows] == [1, 2, 3, 4]
        demo_jobs = [r["job_id"] for r in rows]
        outcomes = "SELECT status::text FROM arm.recognition_job WHERE id = %s"
        with dict_conn(admin_url) as conn:
            wait_for_sync(
                lambda: [scalar(conn, outcomes, (j,)) for j in demo_jobs]
                == ["done", "done", "done", "error"],
                60, project.all_logs, every=POLL,
            )  # fmt: skip

        # The API on the published loopback port: the token required, the file done.
        files = f"http://127.0.0.1:{http_port}/api/v1/files/{up.file_id}"
        assert _get(files, None)[0] == 401
        status, body = _get(files, token)
        assert status == 200 and body["current_job"]["status"] == "done", body
    finally:
        began = time.monotonic()
        downed = project.down()
        print(f"FIGURE podman-compose down -v: {time.monotonic() - began:.1f} s")
    assert downed.returncode == 0, downed.stdout[-3000:] + downed.stderr[-3000:]
    assert project.containers() == [] and project.volumes() == []
