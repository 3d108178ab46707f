"""The console by access level, in a real headless Chromium against a real `arm-core
serve` on a real PostgreSQL (the fixtures and helpers of test_console.py).

The header names who is signed in and at which level, in English and in Russian. A
viewer sees the files and the status but no retry control (no row button, no batch
controls, no button on the file page), and a retry forged from the page with the
viewer's own token is refused (403) with nothing changed. An operator retries. A
credential with neither level (a metrics token; a proxy's user in none of the groups)
is told it may not view the console, and the page asks the API nothing else. A 403 the
page did not expect (the tab's credential changed level) shows the server's message."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from arm_core.devtools.testbed.sql import dict_conn, jobs_of, scalar, stored_file
from tests.console import test_console as base  # skips this module without a browser
from tests.console.test_console_i18n import english_left

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

    from tests.console.test_console import Served

By = base.By
pytestmark = base.pytestmark

# The fixtures: a headless Chromium and `arm-core serve` on this test's database.
browser = base.browser
page = base.page
serve = base.serve

VIEWER = "console-viewer-token-0123456789"
OPERATOR = "console-operator-token-0123456789"
METRICS = "console-metrics-token-0123456789"
TOKENS = f"ivanova:viewer={VIEWER},petrov:operator={OPERATOR},prom:metrics={METRICS}"
TOKEN_KEY = "arm-core.token"  # console.js: where the tab keeps its token

# A POST the page never offers, sent from the page itself with the token it holds.
FORGED = """
const [url, body, key] = arguments;
const token = sessionStorage.getItem(key);
return fetch(url, {
  method: "POST",
  headers: {"Content-Type": "application/json", Authorization: `Bearer ${token}`},
  body: JSON.stringify(body),
}).then(async (r) => [r.status, await r.json(), token]);
"""

# What the file list says of each file's `retryable`, asked with the tab's token.
RETRYABLE = """
const token = sessionStorage.getItem(arguments[0]);
return fetch("/api/v1/files?status=ERROR", {headers: {Authorization: `Bearer ${token}`}})
  .then((r) => r.json())
  .then((body) => Object.fromEntries(body.items.map((item) => [item.id, item.retryable])));
"""

# The list's header cells as shown, and how many cells each row has: read at once (the
# page re-renders the rows on every poll).
LAYOUT = """
const shown = [...document.querySelectorAll("#files thead th")]
  .filter((th) => th.checkVisibility())
  .map((th) => th.textContent.trim());
const cells = [...document.querySelectorAll("#files tbody tr")].map((tr) => tr.cells.length);
return [shown, cells];
"""

# The API paths the page has asked for since it loaded.
ASKED = """
return performance.getEntriesByType("resource")
  .map((e) => new URL(e.name).pathname)
  .filter((path) => path.startsWith("/api/"));
"""

# Every POST the page makes and the status it was answered.
RECORD_POST_STATUSES = """
window.__answers = [];
const real = window.fetch;
window.fetch = async (url, options = {}) => {
  const resp = await real(url, options);
  if (options.method === "POST") window.__answers.push([String(url), resp.status]);
  return resp;
};
"""

# Every element a retry is asked through, static or drawn from data.
RETRY_CONTROLS = ("select-retryable", "retry-selected", "select-all", "selection", "batch-summary")
COLUMNS = ["Name", "Type", "File", "Job", "Attempt", "Error", "Updated"]


def sign_in(driver: WebDriver, url: str, token: str) -> None:
    driver.get(url + "/")
    base.wait_for(
        driver, "the sign-in form", lambda d: d.find_element(By.ID, "signin").is_displayed()
    )
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "signin-submit").click()


def who(driver: WebDriver) -> str:
    text: str = driver.find_element(By.ID, "who").text
    return text


def no_retry_controls(driver: WebDriver) -> None:
    """Nothing on the page asks for a retry: not drawn, or hidden (not merely disabled)."""
    drawn = driver.find_elements(By.CSS_SELECTOR, "button.retry, input.select, #file-retry")
    assert drawn == [], [e.get_attribute("outerHTML") for e in drawn]
    for id_ in RETRY_CONTROLS:
        assert not driver.find_element(By.ID, id_).is_displayed(), id_


def current_job(db_url: str, file_id: uuid.UUID) -> tuple[Any, list[int]]:
    """The file's current job and the attempts it has."""
    with dict_conn(db_url) as conn:
        attempts = [j["attempt"] for j in jobs_of(conn, file_id)]
        return stored_file(conn, file_id)["current_recognition_job_id"], attempts


def test_a_viewer_sees_the_files_and_no_retry_and_a_forged_one_is_refused(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    server = serve(AUTH_MODE="token", API_TOKENS=TOKENS)
    [one] = base.failed(server.db_url, "Отказ распознавания.xlsx")
    base.live(server.db_url, "Ещё в очереди.xlsx")
    sign_in(page, server.url, VIEWER)
    base.wait_for(page, "both files listed", lambda d: len(base.rows(d)) == 2)
    assert who(page) == "signed in as ivanova · viewer"
    level = page.find_element(By.ID, "level")
    assert "may not retry" in (level.get_attribute("title") or "")
    # The reads are a viewer's: the status too.
    base.wait_for(
        page,
        "the status figures",
        lambda d: (
            d.find_element(By.CSS_SELECTOR, '#status [data-job-status="dlq"]').text == "dlq 1"
        ),
    )
    # The failed file is listed with its code, and is retryable (an operator's page would
    # offer it); nothing here offers its retry, nor leaves an empty column in its place.
    failed_row = base.row(page, one.file_id)
    assert failed_row.find_element(By.CSS_SELECTOR, "td.code").text == "NO_ACK"
    assert page.execute_script(RETRYABLE, TOKEN_KEY) == {str(one.file_id): True}
    no_retry_controls(page)
    shown, cells = page.execute_script(LAYOUT)
    assert shown == COLUMNS
    assert cells == [len(COLUMNS)] * 2

    # Nor does the file page.
    base.click_in_row(page, one.file_id, "td.name a")
    base.wait_for(
        page,
        "the file page",
        lambda d: d.find_element(By.CSS_SELECTOR, "#file h2").text == "Отказ распознавания.xlsx",
    )
    assert len(page.find_elements(By.CSS_SELECTOR, "#attempts .attempt-card")) == 1
    assert page.find_elements(By.CSS_SELECTOR, "#file .actions, #file-answer") == []
    no_retry_controls(page)

    # A retry forged from the page's own context, with the viewer's token it holds: 403,
    # naming the level needed, and the file's current job is still attempt 1.
    url = f"/api/v1/files/{one.file_id}/retry"
    status, body, token = page.execute_script(FORGED, url, {"job_id": str(one.job_id)}, TOKEN_KEY)
    assert token == VIEWER
    assert status == 403, body
    assert body["error"]["code"] == "FORBIDDEN"
    assert body["error"]["details"] == {"needed": "operator", "levels": ["viewer"]}
    batch = {"files": [{"file_id": str(one.file_id), "job_id": str(one.job_id)}]}
    status, body, _ = page.execute_script(FORGED, "/api/v1/files/retry", batch, TOKEN_KEY)
    assert (status, body["error"]["code"]) == (403, "FORBIDDEN")
    assert current_job(server.db_url, one.file_id) == (one.job_id, [1])
    with dict_conn(server.db_url) as conn:
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 0

    # In Russian: the level by its Russian name, and no English left on the page.
    page.find_element(By.CSS_SELECTOR, '#lang [data-lang="ru"]').click()
    base.wait_for(
        page, "the header in Russian", lambda d: who(d) == "вы вошли как ivanova · наблюдатель"
    )
    title = page.find_element(By.ID, "level").get_attribute("title") or ""
    assert title.startswith("наблюдатель:") and "повторять не может" in title
    # The status and the file are drawn again in Russian as their next reads come in.
    base.wait_for(page, "no English left", lambda d: english_left(d) == [])
    page.find_element(By.ID, "back").click()
    base.wait_for(page, "the list again", lambda d: len(base.rows(d)) == 2)
    no_retry_controls(page)
    base.wait_for(page, "no English left in the list", lambda d: english_left(d) == [])


def test_an_operator_sees_the_level_and_retries(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    server = serve(AUTH_MODE="token", API_TOKENS=TOKENS)
    [one] = base.failed(server.db_url, "Баланс 2026.xlsx")
    sign_in(page, server.url, OPERATOR)
    base.wait_for(page, "the file listed", lambda d: len(base.rows(d)) == 1)
    assert who(page) == "signed in as petrov · operator"
    for id_ in ("select-retryable", "retry-selected", "select-all"):
        assert page.find_element(By.ID, id_).is_displayed(), id_
    shown, cells = page.execute_script(LAYOUT)
    assert shown == ["", *COLUMNS, "", "Answer"] and cells == [len(shown)]

    page.execute_script(RECORD_POST_STATUSES)
    base.click_in_row(page, one.file_id, "button.retry")
    base.wait_for(
        page,
        "the answer",
        lambda d: base.answer_of(d, one.file_id) == "retried: attempt 2 queued",
    )
    answers = page.execute_script("return window.__answers")
    assert answers == [[f"/api/v1/files/{one.file_id}/retry", 201]]
    job_id, attempts = current_job(server.db_url, one.file_id)
    assert job_id != one.job_id and attempts == [1, 2]
    with dict_conn(server.db_url) as conn:
        assert scalar(conn, "SELECT actor FROM arm.retry_audit") == "petrov"

    page.find_element(By.CSS_SELECTOR, '#lang [data-lang="ru"]').click()
    base.wait_for(
        page, "the level in Russian", lambda d: who(d) == "вы вошли как petrov · оператор"
    )


def test_a_metrics_token_may_not_view_the_console(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    server = serve(AUTH_MODE="token", API_TOKENS=TOKENS)
    base.failed(server.db_url, "Секретный отчёт.xlsx")
    sign_in(page, server.url, METRICS)
    base.wait_for(page, "the refusal", lambda d: d.find_element(By.ID, "forbidden").is_displayed())
    assert page.find_element(By.CSS_SELECTOR, "#forbidden h2").text == (
        "This credential may not view the console"
    )
    assert page.find_element(By.ID, "forbidden-text").text == (
        "prom holds the metrics level: it does not open the console, which needs the viewer "
        "or operator level."
    )
    assert page.find_element(By.ID, "forbidden-hint").text == (
        "Sign in with a viewer's or an operator's token."
    )
    assert who(page) == "signed in as prom · metrics"
    assert not page.find_element(By.ID, "console").is_displayed()
    assert "Секретный" not in page.page_source
    # Not a page of 403s: the page asked who the token is, and nothing else.
    assert set(page.execute_script(ASKED)) == {"/api/v1/whoami"}
    assert page.find_element(By.ID, "access-note").text == ""

    # A reload keeps the token of the tab, and the refusal.
    page.refresh()
    base.wait_for(
        page, "the refusal again", lambda d: d.find_element(By.ID, "forbidden").is_displayed()
    )
    assert set(page.execute_script(ASKED)) == {"/api/v1/whoami"}

    # In Russian.
    page.find_element(By.CSS_SELECTOR, '#lang [data-lang="ru"]').click()
    base.wait_for(
        page,
        "the refusal in Russian",
        lambda d: (
            d.find_element(By.ID, "forbidden-text").text
            == (
                "prom: уровень доступа «метрики» не открывает консоль, для неё нужен уровень "
                "«наблюдатель» или «оператор»."
            )
        ),
    )
    assert page.find_element(By.CSS_SELECTOR, "#forbidden h2").text == (
        "С этими учётными данными консоль недоступна"
    )
    assert who(page) == "вы вошли как prom · метрики"
    page.find_element(By.CSS_SELECTOR, '#lang [data-lang="en"]').click()

    # Signing in with another token stays possible: the sign-in form, the tab forgets
    # the metrics token, and a viewer's token opens the console.
    assert page.find_element(By.ID, "signout").is_displayed()
    page.find_element(By.ID, "forbidden-signin").click()
    base.wait_for(
        page, "the sign-in form", lambda d: d.find_element(By.ID, "signin").is_displayed()
    )
    assert not page.find_element(By.ID, "forbidden").is_displayed()
    assert page.execute_script("return window.sessionStorage.length") == 0
    page.find_element(By.ID, "token").send_keys(VIEWER)
    page.find_element(By.ID, "signin-submit").click()
    base.wait_for(page, "the file list", lambda d: len(base.rows(d)) == 1)
    assert who(page) == "signed in as ivanova · viewer"
    no_retry_controls(page)


def test_a_proxys_user_in_no_group_may_not_view_the_console(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    server = serve(
        AUTH_MODE="header",
        AUTH_GROUPS_HEADER="X-Forwarded-Groups",
        AUTH_OPERATOR_GROUPS="arm-operators",
        AUTH_VIEWER_GROUPS="arm-support",
    )
    base.failed(server.db_url, "Счёт-фактура.pdf")

    def as_proxy(groups: str) -> None:
        headers = {"X-Forwarded-User": "anna@example.org", "X-Forwarded-Groups": groups}
        page.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})

    page.execute_cdp_cmd("Network.enable", {})
    try:
        as_proxy("staff")
        page.get(server.url + "/")
        base.wait_for(
            page, "the refusal", lambda d: d.find_element(By.ID, "forbidden").is_displayed()
        )
        assert page.find_element(By.ID, "forbidden-text").text.startswith(
            "anna@example.org holds no access level"
        )
        assert "group with the viewer or operator level" in (
            page.find_element(By.ID, "forbidden-hint").text
        )
        assert who(page) == "signed in as anna@example.org · no access level"
        # No sign-in of the page's own here: the proxy's.
        assert not page.find_element(By.ID, "forbidden-signin").is_displayed()
        assert not page.find_element(By.ID, "signout").is_displayed()
        assert "Счёт-фактура" not in page.page_source
        assert set(page.execute_script(ASKED)) == {"/api/v1/whoami"}

        # Put in the support group: a viewer.
        as_proxy("staff, arm-support")
        page.refresh()
        base.wait_for(page, "the file list", lambda d: len(base.rows(d)) == 1)
        assert who(page) == "signed in as anna@example.org · viewer"
        no_retry_controls(page)
    finally:
        page.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
        page.execute_cdp_cmd("Network.disable", {})


def test_an_unexpected_403_shows_the_servers_message(
    serve: Callable[..., Served], page: WebDriver
) -> None:
    """The page offered a retry, but the tab's credential is a viewer's by the time it is
    asked (as when a token is re-issued at a lower level): the server refuses, the page
    says what the server said, asks who it is again and offers what that level allows."""
    server = serve(AUTH_MODE="token", API_TOKENS=TOKENS)
    [one] = base.failed(server.db_url, "Баланс 2026.xlsx")
    sign_in(page, server.url, OPERATOR)
    base.wait_for(page, "the file listed", lambda d: len(base.rows(d)) == 1)
    page.execute_script("sessionStorage.setItem(arguments[0], arguments[1])", TOKEN_KEY, VIEWER)
    base.click_in_row(page, one.file_id, "button.retry")
    base.wait_for(
        page, "the note", lambda d: d.find_element(By.ID, "access-note").text.strip() != ""
    )
    note = page.find_element(By.ID, "access-note").text
    # The server's own message, as it answers that retry.
    _, body, _ = page.execute_script(
        FORGED, f"/api/v1/files/{one.file_id}/retry", {"job_id": str(one.job_id)}, TOKEN_KEY
    )
    message = body["error"]["message"]
    assert "operator" in message
    assert note == f"Your access level is now viewer. The server said: FORBIDDEN: {message}"
    base.wait_for(page, "the viewer's header", lambda d: who(d) == "signed in as ivanova · viewer")
    base.wait_for(
        page, "no retry button", lambda d: not d.find_elements(By.CSS_SELECTOR, "button.retry")
    )
    no_retry_controls(page)
    assert current_job(server.db_url, one.file_id) == (one.job_id, [1])

    # In Russian: the code's meaning too, then the server's (English) message.
    page.find_element(By.CSS_SELECTOR, '#lang [data-lang="ru"]').click()
    base.wait_for(
        page, "the header in Russian", lambda d: who(d) == "вы вошли как ivanova · наблюдатель"
    )
    assert page.find_element(By.ID, "access-note").text == (
        "Ваш уровень доступа теперь — наблюдатель. Ответ сервера: "
        f"FORBIDDEN: ваш уровень доступа этого не позволяет ({message})"
    )
