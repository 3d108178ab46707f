"""The operator console in a real headless Chromium, against a real
`arm-core serve` on a real PostgreSQL: filter, open a file, retry it (a double click asks
once), batch retry with each file's answer, and the sign-in flow of AUTH_MODE=token.

Needs Chromium and its WebDriver (Debian: apt-get install chromium chromium-driver) and
selenium (the `test` extra); without them these tests are skipped, saying so. Every wait
is an explicit condition with a deadline (WebDriverWait); the page polls the API itself.

CONSOLE_SCREENSHOT=docs/console.png makes the batch test save what it shows (the picture
of the README and of docs/operators.md)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import random
import shutil
import signal
import ssl
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from psycopg.types.json import Jsonb

from arm_core import instruments
from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.processes import ArmProcess, serve_env
from arm_core.devtools.testbed.sql import (
    Upload,
    ack,
    age,
    archive,
    dict_conn,
    fail_by_no_ack,
    jobs_of,
    publish,
    result,
    sample,
    scalar,
    upload,
)
from arm_core.version import installed
from tests.support.tls import Pair, Pki, assert_no_key_material

pytestmark = pytest.mark.integration

INSTALL = (
    "the console's browser tests need Chromium and chromedriver: "
    "apt-get install chromium chromium-driver (and pip install -e '.[test]' for selenium)"
)
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement
    from selenium.webdriver.support.ui import WebDriverWait

    def SlowWait(driver: WebDriver) -> WebDriverWait[WebDriver]:
        return WebDriverWait(driver, SERIES_WAIT, poll_frequency=0.2)

    HAVE_SELENIUM = True
except ImportError:  # pragma: no cover - the skip below says what to install
    HAVE_SELENIUM = False

if not (HAVE_SELENIUM and CHROMIUM and CHROMEDRIVER):
    pytest.skip(INSTALL, allow_module_level=True)

TOKEN = "console-browser-token-0123456789"
WAIT = 20.0  # seconds: the deadline of every wait (the page polls every 2 s)
HOUR = '#charts [data-chart="queued"] circle'  # the queued chart's dots: one per sample
WAITS = '#charts [data-chart="wait-processing"] .p99 circle'  # one per sample but the first
SERIES_WAIT = 40.0  # the charts ask every 10 s: a wait for a new sample gets longer


def headless_chromium(lang: str, *extra: str) -> WebDriver:
    """The system Chromium, headless, through the system chromedriver, with `lang` as the
    browser's language (the UI's and Accept-Language: the console follows it) and `extra`
    command-line switches."""
    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1500,1000",
        f"--lang={lang}",
        *extra,
    ):
        options.add_argument(arg)
    primary = lang.split("-", 1)[0]
    options.add_experimental_option("prefs", {"intl.accept_languages": f"{lang},{primary}"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def screenshot(page: WebDriver, path: str) -> None:
    """The README's picture of the page: 1500 × 840, the rows and not a blank page under
    them; the window's size is given back after."""
    size = page.get_window_size()
    page.set_window_size(1500, 840)
    try:
        page.save_screenshot(path)
    finally:
        page.set_window_size(size["width"], size["height"])


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    driver = headless_chromium("en-US")
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class Served:
    url: str
    db_url: str


@pytest.fixture
def serve(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Starts `arm-core serve` (no bridge) on this test's database, with extra env."""
    procs: list[ArmProcess] = []

    def start(**env: str) -> Served:
        port = free_port()
        full = serve_env(db_url, port, **env)
        proc = ArmProcess("serve", full, tmp_path / f"serve-{len(procs)}.log")
        procs.append(proc)
        proc.wait_healthy(port)
        return Served(f"http://127.0.0.1:{port}", db_url)

    yield start
    for proc in procs:
        assert proc.stop() == 0
        assert "Traceback" not in proc.log(), proc.log()[-3000:]


@pytest.fixture
def page(browser: WebDriver) -> Iterator[WebDriver]:
    browser.delete_all_cookies()
    yield browser
    # No page polling a stopped server. (Each test's server has its own port, so its own
    # origin: no token or storage carries over.)
    browser.get("about:blank")


def failed(db_url: str, *names: str) -> list[Upload]:
    """Files whose attempt 1 ended dlq / NO_ACK (file ERROR, retryable)."""
    with dict_conn(db_url) as conn:
        ups = [upload(conn, "XLSX", name=name) for name in names]
        publish(conn)
        fail_by_no_ack(conn)
    return ups


def live(db_url: str, name: str) -> Upload:
    with dict_conn(db_url) as conn:
        return upload(conn, "XLSX", name=name)


def others(db_url: str) -> None:
    """A file done, one being processed and one the parser refused (error, retryable)."""
    with dict_conn(db_url) as conn:
        done = upload(conn, "XLSX", name="ОСВ РБ 2025 (итог).xlsx")
        busy = upload(conn, "PDF", name="Скан договора №17.pdf")
        bad = upload(conn, "XLS", name="Ведомость старая.xls")
        publish(conn)
        for up in (done, busy, bad):
            ack(conn, up.job_id, up.file_id)
        result(conn, done.job_id, done.file_id)
        result(
            conn,
            bad.job_id,
            bad.file_id,
            status="error",
            error=("PARSE_FAILED", "no sheet with a trial balance"),
        )


def an_hour_of_samples(db_url: str) -> None:
    """A busy hour for the README's pictures: 60 samples of a steady flow with a backlog
    half an hour ago, each with the bridges' waits folded in, as sample_status writes
    them."""
    rng = random.Random(7)
    now = dt.datetime.now(dt.UTC)
    totals = {"done": 10_000, "needs_check": 300, "error": 40, "timeout": 3, "dlq": 1}
    buckets = len(instruments.JOB_WAIT_BUCKETS) + 1

    def waits(usual: int, slower: int) -> list[int]:
        counts = [0] * buckets
        for _ in range(40):
            counts[min(buckets - 1, usual + slower + rng.choice((-1, 0, 0, 0, 1)))] += 1
        return counts

    with dict_conn(db_url) as conn:
        for minute in range(60, 0, -1):
            backlog = 34 >= minute >= 27
            totals["done"] += rng.randint(8, 20) if backlog else rng.randint(30, 45)
            totals["needs_check"] += rng.randint(0, 3)
            totals["error"] += rng.randint(0, 2) if minute != 30 else 9
            queued = rng.randint(0, 4) + (120 - 12 * abs(minute - 31) if backlog else 0)
            at = now - dt.timedelta(minutes=minute - 1, seconds=30)  # all in the hour
            conn.execute(
                "INSERT INTO arm.status_sample VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    at,
                    Jsonb({"queued": queued, **totals}),
                    40.0 if backlog else rng.random(),
                    waits(2, 4 if backlog else 0),
                    waits(3, 0),
                    waits(7, 0),
                ),
            )


def wait_for(driver: WebDriver, what: str, cond: Callable[[WebDriver], Any]) -> Any:
    def check(d: WebDriver) -> Any:
        try:
            return cond(d)
        except StaleElementReferenceException:  # re-rendered by a poll: look again
            return False

    return WebDriverWait(driver, WAIT, poll_frequency=0.1).until(check, f"waiting for {what}")


def rows(driver: WebDriver) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, "#files tbody tr")


def row(driver: WebDriver, file_id: uuid.UUID) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, f'#files tr[data-file-id="{file_id}"]')


def click_in_row(driver: WebDriver, file_id: uuid.UUID, selector: str) -> None:
    """Clicks `selector` in a file's row. A poll may re-render the list between finding
    the element and clicking it (a stale element is not clicked): then it is found and
    clicked again."""

    def clicked(d: WebDriver) -> bool:
        row(d, file_id).find_element(By.CSS_SELECTOR, selector).click()
        return True

    wait_for(driver, f"{selector} clicked in the row of {file_id}", clicked)


def answer_of(driver: WebDriver, file_id: uuid.UUID) -> str:
    """The answer next to a file. The list re-renders live (new attempts, the status
    poll), so the row found may be replaced before its text is read: then it is found
    again; the answers themselves outlive a re-render."""
    for _ in range(50):
        try:
            text: str = row(driver, file_id).find_element(By.CSS_SELECTOR, ".answer-cell").text
        except StaleElementReferenceException:
            continue
        return text
    raise AssertionError(f"the row of {file_id} was replaced 50 times in a row")


def visible_text(driver: WebDriver) -> str:
    text: str = driver.find_element(By.TAG_NAME, "body").text
    return text


def test_filter_open_retry_and_see_attempt_2(serve: Callable[..., Served], page: WebDriver) -> None:
    server = serve()
    one, two = failed(server.db_url, "ОСВ РБ Январь.xlsx", "Оборотно-сальдовая ведомость.xlsx")
    running = live(server.db_url, "Живой файл.xlsx")
    with dict_conn(server.db_url) as conn:  # the sweep runs once: nothing was overdue
        conn.execute(
            "UPDATE arm.periodic_task SET next_run_at = now() WHERE name = 'sweep_timeouts'"
        )
        conn.execute("SELECT * FROM arm.run_due_tasks()")
    page.get(server.url + "/")
    wait_for(page, "three files listed", lambda d: len(rows(d)) == 3)
    assert "authentication off" in page.find_element(By.ID, "who").text
    # Cyrillic names render as they are stored (UTF-8 end to end).
    assert row(page, one.file_id).find_element(By.CSS_SELECTOR, "td.name").text == (
        "ОСВ РБ Январь.xlsx"
    )
    # The status figures at the top (GET /api/v1/status, polled).
    wait_for(
        page,
        "the status figures",
        lambda d: (
            d.find_element(By.CSS_SELECTOR, '#status [data-job-status="dlq"]').text == "dlq 2"
        ),
    )
    figures = page.find_element(By.ID, "status").text
    assert "OLDEST QUEUED" in figures and "no bridge has reported in the last day" in figures
    assert "· 0 timed out" in figures  # the last sweep: its time, then what the 0 counts
    # Each pipeline's service, as pacing sees it (no bridge claimed yet: no limit).
    service = page.find_element(By.CSS_SELECTOR, '#status [data-pipeline="tabular"]').text
    assert "TABULAR SERVICE" in service.upper()
    assert "no limit · in flight 0 · queued 1" in service
    # The live file cannot be retried; a failed one shows attempt n / max and its code.
    assert not row(page, running.file_id).find_element(By.CSS_SELECTOR, "button.retry").is_enabled()
    first = row(page, one.file_id)
    assert first.find_element(By.CSS_SELECTOR, "td.attempt").text.startswith("1 / ")
    assert first.find_element(By.CSS_SELECTOR, "td.code").text == "NO_ACK"

    # Filter to failed files.
    page.find_element(By.CSS_SELECTOR, '#filters input[name=status][value="ERROR"]').click()
    page.find_element(By.ID, "apply").click()
    wait_for(page, "only the failed files", lambda d: len(rows(d)) == 2)
    assert {r.get_attribute("data-file-id") for r in rows(page)} == {
        str(one.file_id),
        str(two.file_id),
    }
    assert "status=ERROR" in page.current_url

    # Open one: its page shows attempt 1 as a timeline.
    click_in_row(page, one.file_id, "td.name a")
    wait_for(
        page,
        "the file page",
        lambda d: d.find_element(By.CSS_SELECTOR, "#file h2").text == "ОСВ РБ Январь.xlsx",
    )
    cards = page.find_elements(By.CSS_SELECTOR, "#attempts .attempt-card")
    assert len(cards) == 1
    assert "NO_ACK" in cards[0].text and "acked (started)" in cards[0].text
    assert "Nobody has retried this file." in visible_text(page)

    # Retry it with a double click: one attempt, one answer ("retried", not a 409).
    ActionChains(page).double_click(page.find_element(By.ID, "file-retry")).perform()
    wait_for(
        page,
        "attempt 2 on the file page",
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#attempts .attempt-card")) == 2,
    )
    assert page.find_element(By.ID, "file-answer").text == "retried: attempt 2 queued"
    second = page.find_element(By.CSS_SELECTOR, '#attempts .attempt-card[data-attempt="2"]')
    assert "queued" in second.text and "current" in second.text
    wait_for(
        page, "the retry audit", lambda d: d.find_elements(By.CSS_SELECTOR, "#retries tbody tr")
    )
    audit = page.find_element(By.CSS_SELECTOR, "#retries tbody tr").text
    # AUTH_MODE=none: anonymous, holding every level.
    assert "anonymous · every level" in audit and "attempt 1 → attempt 2" in audit
    assert not page.find_element(By.ID, "file-retry").is_enabled()
    with dict_conn(server.db_url) as conn:
        assert [j["attempt"] for j in jobs_of(conn, one.file_id)] == [1, 2]
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 1

    # Back to the list, filters kept; the retried file is no longer ERROR: it leaves.
    page.find_element(By.ID, "back").click()
    wait_for(page, "the failed list without the retried file", lambda d: len(rows(d)) == 1)
    assert rows(page)[0].get_attribute("data-file-id") == str(two.file_id)

    # A filter the API refuses is said next to the filters, with no rows under it.
    page.find_element(By.CSS_SELECTOR, "#filters input[name=consolidation_id]").send_keys("nope")
    page.find_element(By.ID, "apply").click()
    wait_for(
        page,
        "the refusal",
        lambda d: "consolidation_id" in d.find_element(By.ID, "list-error").text,
    )
    assert rows(page) == []


def test_batch_retry_answers_each_file(serve: Callable[..., Served], page: WebDriver) -> None:
    server = serve()
    others(server.db_url)  # files in other states around them, as on a real day
    an_hour_of_samples(server.db_url)  # and the charts of a busy hour
    one, two = failed(server.db_url, "Баланс 2026.xlsx", "Отчёт о прибылях.xlsx")
    running = live(server.db_url, "Ещё обрабатывается.xlsx")
    page.get(server.url + "/")
    wait_for(page, "six files listed", lambda d: len(rows(d)) == 6)
    # A recognised file stays PROCESSING (the mapping step is another service's): said so.
    notes = {
        r.find_element(By.CSS_SELECTOR, "td.name").text: r.find_elements(
            By.CSS_SELECTOR, ".note.mapping"
        )
        for r in rows(page)
    }
    assert [n.text for n in notes.pop("ОСВ РБ 2025 (итог).xlsx")] == [
        "recognised; waits for mapping"
    ]
    assert all(not found for found in notes.values()), notes
    wait_for(
        page, "the hour's 60 samples", lambda d: len(d.find_elements(By.CSS_SELECTOR, HOUR)) == 60
    )
    assert len(page.find_elements(By.CSS_SELECTOR, WAITS)) == 59
    for upload_ in (one, two, running):
        click_in_row(page, upload_.file_id, "input.select")
    button = page.find_element(By.ID, "retry-selected")
    assert button.text == "Retry selected (3)"
    button.click()
    wait_for(
        page,
        "an answer next to every file",
        lambda d: all(
            answer_of(d, u.file_id) not in ("", "retrying…") for u in (one, two, running)
        ),
    )
    assert answer_of(page, one.file_id) == "retried: attempt 2 queued"
    assert answer_of(page, two.file_id) == "retried: attempt 2 queued"
    assert answer_of(page, running.file_id) == "skipped: still running (queued)"
    assert page.find_element(By.ID, "batch-summary").text == "3 files: 2 retried, 1 skipped"
    # Live: the rows show the new attempts without a reload.
    wait_for(
        page,
        "attempt 2 in the list",
        lambda d: (
            row(d, one.file_id).find_element(By.CSS_SELECTOR, "td.attempt").text.startswith("2 / ")
        ),
    )
    with dict_conn(server.db_url) as conn:
        assert len(jobs_of(conn, one.file_id)) == 2 and len(jobs_of(conn, two.file_id)) == 2
        assert len(jobs_of(conn, running.file_id)) == 1
    shot = os.environ.get("CONSOLE_SCREENSHOT")
    if shot:  # once the (cached) status figures show the retries too
        wait_for(
            page,
            "the status after the retries",
            lambda d: (
                d.find_element(By.CSS_SELECTOR, '#status [data-job-status="queued"]').text
                == "queued 3"
            ),
        )
        screenshot(page, shot)


def test_the_charts_draw_the_last_hour_from_the_databases_samples(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    server = serve()
    page.get(server.url + "/")
    wait_for(
        page,
        "the charts' empty state",
        lambda d: "No samples yet" in d.find_element(By.ID, "charts").text,
    )
    with dict_conn(server.db_url) as conn:
        ups = [upload(conn, "XLSX", name=f"Файл {i}.xlsx") for i in range(5)]
        sample(conn, ago=120)
        sample(conn, ago=60)
        publish(conn)
        for up in ups[:3]:
            ack(conn, up.job_id, up.file_id)
            result(conn, up.job_id, up.file_id)
        result(conn, ups[3].job_id, ups[3].file_id, status="error", error=("PARSE_FAILED", "x"))
        # Ten waits between 0.5 and 1 s, as a bridge hands them over: p50 0.75, p99 0.995.
        counts = [0] * (len(instruments.JOB_WAIT_BUCKETS) + 1)
        counts[5] = 10
        conn.execute("SELECT arm.record_waits('queued', %s)", (counts,))
        sample(conn)

    def caption(d: WebDriver, key: str) -> str:
        return str(
            d.find_element(By.CSS_SELECTOR, f'#charts [data-chart="{key}"] figcaption .value').text
        )

    def dots(d: WebDriver, key: str, series: str) -> int:
        return len(
            d.find_elements(By.CSS_SELECTOR, f'#charts [data-chart="{key}"] .{series} circle')
        )

    SlowWait(page).until(lambda d: dots(d, "queued", "queued") == 3, "three samples drawn")
    assert caption(page, "finished") == "4/min"  # 3 done and 1 error in the last minute
    bars = page.find_elements(By.CSS_SELECTOR, '#charts [data-chart="finished"] rect')
    assert sorted((b.get_attribute("data-outcome"), b.get_attribute("data-n")) for b in bars) == [
        ("done", "3"),
        ("error", "1"),
    ]
    assert caption(page, "queued") == "0"  # all five published by the last sample
    assert caption(page, "wait-queued") == "p50 750 ms · p99 995 ms"
    assert (dots(page, "wait-queued", "p50"), dots(page, "wait-queued", "p99")) == (1, 1)
    assert caption(page, "wait-ack") == "—"  # no bridge observed an ack wait
    assert dots(page, "oldest", "oldest") == 3
    # A dot's tooltip names its time and value; the y scale its highest value.
    queued_scale = page.find_element(By.CSS_SELECTOR, '#charts [data-chart="queued"] text.scale')
    assert queued_scale.text == "5"
    # A new sample shows without a reload.
    with dict_conn(server.db_url) as conn:
        upload(conn, "XLSX", name="Новый.xlsx")
        sample(conn)
    SlowWait(page).until(lambda d: dots(d, "queued", "queued") == 4, "the fourth sample drawn")
    assert caption(page, "queued") == "1"
    assert caption(page, "finished") == "0/min"


def test_status_changes_show_without_a_reload(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    server = serve()
    running = live(server.db_url, "Новый файл.pdf")
    page.get(server.url + "/")
    wait_for(page, "the file listed", lambda d: len(rows(d)) == 1)
    job_badge = "td:nth-child(5) .badge"
    assert row(page, running.file_id).find_element(By.CSS_SELECTOR, job_badge).text == "queued"
    with dict_conn(server.db_url) as conn:
        publish(conn)
        fail_by_no_ack(conn)
    wait_for(
        page,
        "the job's new status",
        lambda d: row(d, running.file_id).find_element(By.CSS_SELECTOR, job_badge).text == "dlq",
    )
    assert row(page, running.file_id).find_element(By.CSS_SELECTOR, "button.retry").is_enabled()
    # "Select the retryable" picks exactly the failed files with attempts left.
    with dict_conn(server.db_url) as conn:
        upload(conn, "XLSX", name="Ещё в очереди.xlsx")
    wait_for(page, "the new file", lambda d: len(rows(d)) == 2)
    page.find_element(By.ID, "select-retryable").click()
    checked = [
        r.get_attribute("data-file-id")
        for r in rows(page)
        if r.find_element(By.CSS_SELECTOR, "input.select").is_selected()
    ]
    assert checked == [str(running.file_id)]
    assert page.find_element(By.ID, "retry-selected").text == "Retry selected (1)"


def test_token_sign_in_shows_nothing_before(serve: Callable[..., Served], page: WebDriver) -> None:
    server = serve(AUTH_MODE="token", API_TOKENS=f"ops={TOKEN}")
    [one] = failed(server.db_url, "Секретный отчёт.xlsx")
    page.get(server.url + "/")
    wait_for(page, "the sign-in form", lambda d: d.find_element(By.ID, "signin").is_displayed())
    assert not page.find_element(By.ID, "console").is_displayed()
    assert "Секретный" not in page.page_source and "NO_ACK" not in page.page_source

    token = page.find_element(By.ID, "token")
    token.send_keys("not-the-token-at-all")
    page.find_element(By.ID, "signin-submit").click()
    wait_for(
        page,
        "the refusal",
        lambda d: d.find_element(By.ID, "signin-error").text == "That token is not accepted.",
    )
    assert not page.find_element(By.ID, "console").is_displayed()
    assert "Секретный" not in page.page_source

    token.clear()
    token.send_keys(TOKEN)
    page.find_element(By.ID, "signin-submit").click()
    wait_for(page, "the file list", lambda d: len(rows(d)) == 1)
    assert page.find_element(By.ID, "who").text == "signed in as ops · operator"
    assert "Секретный отчёт.xlsx" in visible_text(page)
    assert not page.find_element(By.ID, "signin").is_displayed()

    # The token is kept in this tab's session: a reload stays signed in.
    page.refresh()
    wait_for(page, "the list after a reload", lambda d: len(rows(d)) == 1)

    # The retry is recorded as the token's actor.
    click_in_row(page, one.file_id, "button.retry")
    wait_for(page, "the answer", lambda d: answer_of(d, one.file_id) == "retried: attempt 2 queued")
    with dict_conn(server.db_url) as conn:
        assert scalar(conn, "SELECT actor FROM arm.retry_audit") == "ops"

    # Signing out forgets the token and shows the form only.
    page.find_element(By.ID, "signout").click()
    wait_for(page, "the sign-in form", lambda d: d.find_element(By.ID, "signin").is_displayed())
    assert rows(page) == [] and not page.find_element(By.ID, "console").is_displayed()
    assert page.execute_script("return window.sessionStorage.length") == 0


def test_header_mode_shows_the_proxys_identity(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    server = serve(AUTH_MODE="header")
    failed(server.db_url, "Счёт-фактура.pdf")
    page.execute_cdp_cmd("Network.enable", {})
    try:
        page.get(server.url + "/")
        wait_for(page, "the refusal", lambda d: d.find_element(By.ID, "denied").is_displayed())
        assert "did not say who you are" in visible_text(page)
        assert "Счёт-фактура" not in page.page_source
        # What an authenticating proxy adds to every request.
        page.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"X-Forwarded-User": "anna@example.org"}}
        )
        page.refresh()
        wait_for(page, "the file list", lambda d: len(rows(d)) == 1)
        assert page.find_element(By.ID, "who").text == "signed in as anna@example.org · operator"
        assert not page.find_element(By.ID, "signout").is_displayed()
    finally:
        page.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
        page.execute_cdp_cmd("Network.disable", {})


def test_the_console_works_over_https(db_url: str, tmp_path: Path) -> None:
    """`arm-core serve` with HTTP_TLS_CERT_FILE / HTTP_TLS_KEY_FILE: the page, its script
    and every API call over HTTPS. Chromium trusts the test CA's certificate by its public
    key (--ignore-certificate-errors-spki-list: no certificate store to install into)."""
    pki = Pki(tmp_path / "pki")
    site = pki.issue("console", "127.0.0.1")
    port = free_port()
    env = serve_env(
        db_url, port, HTTP_TLS_CERT_FILE=str(site.cert), HTTP_TLS_KEY_FILE=str(site.key)
    )
    proc = ArmProcess("serve", env, tmp_path / "serve.log")
    driver = headless_chromium("en-US", f"--ignore-certificate-errors-spki-list={spki(site)}")
    try:
        trusted = ssl.create_default_context(cafile=str(pki.ca_file))
        proc.wait_healthy(port, context=trusted)
        failed(db_url, "Баланс по TLS.xlsx")
        driver.get(f"https://127.0.0.1:{port}/")
        wait_for(driver, "the file listed over HTTPS", lambda d: len(rows(d)) == 1)
        assert driver.execute_script("return location.protocol") == "https:"
        rows(driver)[0].find_element(By.CSS_SELECTOR, "button.retry").click()
        wait_for(
            driver,
            "the retry answered over HTTPS",
            lambda d: (
                answer_of(d, uuid.UUID(rows(d)[0].get_attribute("data-file-id")))
                not in ("", "retrying…")  # the answer, not the click's own word
            ),
        )
        assert answer_of(driver, uuid.UUID(rows(driver)[0].get_attribute("data-file-id"))) == (
            "retried: attempt 2 queued"
        )
    finally:
        driver.quit()
        assert proc.stop() == 0
    assert_no_key_material({"serve": proc.log()}, pki)


def spki(pair: Pair) -> str:
    """The base64 SHA-256 of a certificate's public key, as Chromium's switch takes it."""
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    der = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


RECORD_POSTS = """
window.__posts = [];
const real = window.fetch;
window.fetch = (url, options = {}) => {
  if (options.method === "POST") window.__posts.push([String(url), options.body]);
  return real(url, options);
};
"""


def test_a_retry_names_the_attempt_the_page_shows(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    """The console always says which attempt it retries (the job it shows as
    the file's current one), single and batch, so a late second click after that
    attempt's retry already failed is refused, not a third attempt."""
    server = serve()
    one, two = failed(server.db_url, "Баланс 1.xlsx", "Баланс 2.xlsx")
    page.get(server.url + "/")
    wait_for(page, "two files listed", lambda d: len(rows(d)) == 2)
    page.execute_script(RECORD_POSTS)
    click_in_row(page, one.file_id, "button.retry")
    wait_for(page, "the answer", lambda d: answer_of(d, one.file_id) == "retried: attempt 2 queued")
    click_in_row(page, two.file_id, "input.select")
    page.find_element(By.ID, "retry-selected").click()
    wait_for(page, "the batch answer", lambda d: answer_of(d, two.file_id) != "")
    posts = [(url, json.loads(body)) for url, body in page.execute_script("return window.__posts")]
    assert posts == [
        (f"/api/v1/files/{one.file_id}/retry", {"job_id": str(one.job_id)}),
        (
            "/api/v1/files/retry",
            {"files": [{"file_id": str(two.file_id), "job_id": str(two.job_id)}]},
        ),
    ]
    # The answer to a click on an attempt that moved on meanwhile, in words.
    with dict_conn(server.db_url) as conn:
        publish(conn)
        fail_by_no_ack(conn)  # both second attempts fail at once
    stale = page.execute_script(
        "return fetch(arguments[0], {method: 'POST', headers: {'Content-Type': 'application/json'},"
        " body: JSON.stringify({job_id: arguments[1]})}).then((r) => r.status)",
        f"/api/v1/files/{one.file_id}/retry",
        str(one.job_id),
    )
    assert stale == 409
    with dict_conn(server.db_url) as conn:
        assert [j["attempt"] for j in jobs_of(conn, one.file_id)] == [1, 2]


def test_an_archived_file_says_so_and_offers_no_retry(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    """A file moved to the archive (arm.archive_files) opens from its link with its whole
    history, says it is archived, and its retry button is off."""
    server = serve()
    [old] = failed(server.db_url, "Баланс 2019.xlsx")
    with dict_conn(server.db_url) as conn:
        age(conn, old.file_id, 800)
        assert archive(conn, days=730)["files"] == 1
    page.get(f"{server.url}/#/files/{old.file_id}")
    wait_for(
        page,
        "the archived file's page",
        lambda d: d.find_element(By.CSS_SELECTOR, "#file h2").text == "Баланс 2019.xlsx",
    )
    note = page.find_element(By.ID, "file-archived").text
    assert note.startswith("Archived:") and "cannot be retried" in note
    assert "archived" in page.find_element(By.CSS_SELECTOR, "#file dl.facts").text
    assert not page.find_element(By.ID, "file-retry").is_enabled()
    cards = page.find_elements(By.CSS_SELECTOR, "#attempts .attempt-card")
    assert len(cards) == 1 and "NO_ACK" in cards[0].text


def test_a_console_without_a_bridge_shows_each_bridge_and_one_gone_silent(
    serve: Callable[..., Served], page: WebDriver, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """The deployment's shape: `serve` runs no bridge (NATS_ENABLED=false) and a bridge
    runs apart. The console shows that bridge from the row it writes every few seconds
    (arm.bridge_instances); paused (SIGSTOP), it shows it silent; stopped cleanly, the
    bridge removes its row and the console says no bridge has reported. The footer names
    the version the console's process runs."""
    server = serve()
    env = {
        "DATABASE_URL": server.db_url,
        "NATS_URL": nats_server.url(),
        "NATS_ENABLED": "true",
        "BRIDGE_HEALTH_PORT": str(health := free_port()),
    }
    bridge = ArmProcess("bridge", env, tmp_path / "bridge.log")
    try:
        bridge.wait_healthy(health)
        page.get(server.url + "/")
        shown = '#status [data-bridge^="arm-core@"]'

        def figure(d: WebDriver) -> tuple[str, str]:
            """The bridge's figure, its text and its classes, read at once (the page
            re-renders the status on every poll)."""
            found = d.execute_script(
                "const e = document.querySelector(arguments[0]);"
                "return e ? [e.innerText, e.className] : ['', ''];",
                shown,
            )
            return str(found[0]), str(found[1])

        wait_for(page, "the bridge, alive", lambda d: "seen" in figure(d)[0])
        text, classes = figure(page)
        # The label is shown upper-case (console.css): 1.1.0.dev0 reads 1.1.0.DEV0.
        assert "nats ok · listener ok" in text, text
        assert f"({installed()})".upper() in text.upper(), text
        # The footer says which version the console's own process runs.
        assert page.find_element(By.ID, "footer").text == f"arm-core {installed()}"
        assert "warn" not in classes, (text, classes)
        os.kill(bridge.proc.pid, signal.SIGSTOP)
        try:
            SlowWait(page).until(lambda d: "silent for" in figure(d)[0], "the bridge, silent")
            assert "warn" in figure(page)[1]
        finally:
            os.kill(bridge.proc.pid, signal.SIGCONT)
    finally:
        assert bridge.stop() == 0, bridge.log()
    wait_for(
        page,
        "no bridge left",
        lambda d: "no bridge has reported in the last day" in d.find_element(By.ID, "status").text,
    )
    assert not page.find_elements(By.CSS_SELECTOR, shown)


def test_a_timeout_says_whose_it_was(serve: Callable[..., Served], page: WebDriver) -> None:
    """TIMEOUT is the core's code for a job past its reply deadline (status timeout) and
    may also be a service's own (status error): the code's title tells them apart."""
    server = serve()
    with dict_conn(server.db_url) as conn:
        swept = upload(conn, "XLSX", name="Без ответа.xlsx")
        gave_up = upload(conn, "XLSX", name="Сервис сдался.xlsx")
        publish(conn, tabular_timeout=0, image_timeout=0)
        ack(conn, gave_up.job_id, gave_up.file_id)
        result(conn, gave_up.job_id, gave_up.file_id, "error", error=("TIMEOUT", "30 s limit"))
        assert scalar(conn, "SELECT arm.sweep_timeouts()") == 1
    page.get(server.url + "/")
    wait_for(page, "two files listed", lambda d: len(rows(d)) == 2)

    def code(upload_: Upload) -> tuple[str, str]:
        cell = row(page, upload_.file_id).find_element(By.CSS_SELECTOR, "td.code")
        return cell.text, cell.get_attribute("title") or ""

    assert code(swept) == ("TIMEOUT", "the service did not answer before the reply deadline")
    assert code(gave_up) == (
        "TIMEOUT",
        "the service gave up on the file: its own time limit ran out",
    )
