"""The operator console in Russian and English.

One catalogue, src/arm_core/console/messages.json ({"en": {...}, "ru": {...}}), holds every
text the page shows; console.js takes the language from the header's switch (remembered
in localStorage) or else from the browser (the first ru* or en* of navigator.languages;
English by default). Status and error codes stay as they are, explained in a title.

The first test reads the files only; the others drive a real headless Chromium whose
language is Russian against a real `arm-core serve` (the fixtures and helpers of
test_console.py). CONSOLE_SCREENSHOT_RU=docs/console-ru.png makes the Russian test save
what it shows (the picture of the README and of docs/operators.md)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from arm_core.access import LEVELS

CONSOLE = Path(__file__).resolve().parents[2] / "src" / "arm_core" / "console"

try:
    from tests.console import test_console as base

    HAVE_BROWSER = True
    SKIP_REASON = ""
except pytest.skip.Exception as skipped:  # no Chromium, chromedriver or selenium
    HAVE_BROWSER = False
    SKIP_REASON = str(skipped)

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

    from tests.console.test_console import Served

browser_test = pytest.mark.skipif(not HAVE_BROWSER, reason=SKIP_REASON)


def catalogues() -> dict[str, dict[str, str]]:
    loaded: dict[str, dict[str, str]] = json.loads(
        (CONSOLE / "messages.json").read_text(encoding="utf-8")
    )
    return loaded


# --- the catalogues ------------------------------------------------------------------


def test_the_catalogues_match_and_hold_every_key_the_page_uses() -> None:
    messages = catalogues()
    assert set(messages) == {"en", "ru"}
    en, ru = messages["en"], messages["ru"]
    assert list(en) == list(ru), set(en) ^ set(ru)
    for lang, catalogue in messages.items():
        empty = [key for key, value in catalogue.items() if not value.strip()]
        assert not empty, (lang, empty)
    # The {placeholders} of a text are the same in both languages.
    for key in en:
        assert sorted(re.findall(r"\{\w+\}", en[key])) == sorted(re.findall(r"\{\w+\}", ru[key])), (
            key
        )
    # Every Russian text has Cyrillic in it: none was left in English.
    latin_only = [k for k, v in ru.items() if not re.search("[а-яё]", v, re.I)]
    assert not latin_only, latin_only

    html = re.sub(
        r"<!--.*?-->", "", (CONSOLE / "index.html").read_text(encoding="utf-8"), flags=re.S
    )
    js = re.sub(r"^\s*//.*$", "", (CONSOLE / "console.js").read_text(encoding="utf-8"), flags=re.M)
    html_keys = set(re.findall(r'data-i18n(?:-title|-aria-label)?="([^"]+)"', html))
    js_keys = set(re.findall(r"""\bt\(\s*["']([^"'`]+)["']""", js))
    assert len(html_keys) > 30 and len(js_keys) > 60, (len(html_keys), len(js_keys))
    assert html_keys - set(en) == set()
    assert js_keys - set(en) == set()
    # Keys the page builds from a code: every status of the filters has its explanation.
    for kind, name in (("filestatus", "status"), ("jobstatus", "job_status")):
        codes = re.findall(rf'name="{name}" value="([^"]+)"', html)
        assert len(codes) >= 3, kind
        assert {f"{kind}.{code}" for code in codes} <= set(en), kind
    # Every key is used somewhere (a dynamic one by its prefix: `code.${...}` and so on).
    prefixes = set(re.findall(r"`(\w+)\.\$\{", js))  # `code.${...}`, `api.${...}`
    assert prefixes == {"code", "api", "level"}, prefixes
    # Every access level the API has its name and what it allows (`level.${...}`).
    assert {f"level.{level}{about}" for level in LEVELS for about in ("", ".about")} <= set(en)
    assert "`${kind}status.${status}`" in js  # filestatus.*, jobstatus.*
    dynamic = prefixes | {"filestatus", "jobstatus"}
    unused = [
        key for key in en if key not in html_keys | js_keys and key.split(".", 1)[0] not in dynamic
    ]
    assert not unused, unused
    # No text of the page left in the JS in English: every string literal that reads like
    # a sentence goes through t().
    for literal in re.findall(r'"([^"\n]*)"|`([^`\n]*)`', js):
        text = next(filter(None, literal), "")
        assert not re.fullmatch(r"[A-Z][a-z]+(?: [a-z]+){2,}[.…]?", text), text


# --- in the browser ------------------------------------------------------------------


@pytest.fixture(scope="module")
def ru_browser() -> Iterator[WebDriver]:
    driver = base.headless_chromium("ru-RU")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def ru_page(ru_browser: WebDriver) -> Iterator[WebDriver]:
    ru_browser.delete_all_cookies()
    yield ru_browser
    ru_browser.get("about:blank")


if HAVE_BROWSER:
    serve = base.serve  # the fixture: `arm-core serve` on this test's database

# Every visible text node of the page, without the codes that stay as they are (status
# badges, error codes, the filters' status names, <code>) and the data (file names).
VISIBLE_TEXTS = """
const skip = ".badge, .status-code, .code, code, pre, td.name, h2.name";
const out = [];
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  const text = node.data.trim();
  const el = node.parentElement;
  if (!text || !el || el.closest(skip) || el.closest("noscript")) continue;
  if (!el.checkVisibility()) continue;
  out.push(text);
}
for (const el of document.querySelectorAll("[title], [aria-label]")) {
  for (const attr of ["title", "aria-label"]) {
    const value = (el.getAttribute(attr) || "").trim();
    if (value) out.push(value);
  }
}
return out;
"""


def english_left(driver: WebDriver) -> list[str]:
    """The page's texts that are an English text of the catalogue (and not the same in
    Russian): a label nobody translated."""
    messages = catalogues()
    english = {v for k, v in messages["en"].items() if v != messages["ru"][k]}
    texts: list[str] = driver.execute_script(VISIBLE_TEXTS)
    assert len(texts) > 20 and "Консоль arm-core" in texts, texts  # the walk sees the page
    return sorted({text for text in texts if text in english})


def cyrillic(text: str) -> bool:
    return re.search("[а-яё]", text, re.I) is not None


@browser_test
@pytest.mark.integration
def test_a_russian_browser_gets_the_console_in_russian(
    serve: Callable[..., Served], ru_page: WebDriver
) -> None:
    from selenium.webdriver.common.by import By

    page = ru_page
    server = serve()
    base.others(server.db_url)
    base.an_hour_of_samples(server.db_url)  # the charts' texts too
    one, two = base.failed(server.db_url, "Баланс 2026.xlsx", "Отчёт о прибылях.xlsx")
    running = base.live(server.db_url, "Ещё обрабатывается.xlsx")
    page.get(server.url + "/")
    base.wait_for(page, "six files listed", lambda d: len(base.rows(d)) == 6)
    base.wait_for(
        page,
        "the status figures",
        lambda d: (
            d.find_element(By.CSS_SELECTOR, '#status [data-job-status="dlq"]').text == "dlq 2"
        ),
    )
    assert page.execute_script("return navigator.language").lower().startswith("ru")
    assert page.execute_script("return document.documentElement.lang") == "ru"
    assert page.title == "Консоль arm-core"
    assert page.find_element(By.CSS_SELECTOR, "header h1").text == "Консоль arm-core"
    legends = [e.text for e in page.find_elements(By.CSS_SELECTOR, "#filters legend")]
    assert legends == ["Статус файла", "Статус задания"]
    assert page.find_element(By.ID, "apply").text == "Применить фильтры"
    assert page.find_element(By.ID, "select-retryable").text == "Выбрать доступные для повтора"
    headers = [e.text for e in page.find_elements(By.CSS_SELECTOR, "#files thead th")]
    assert headers[1:4] == ["Имя файла", "Тип", "Файл"]
    assert "ЗАДАНИЯ" in page.find_element(By.ID, "status").text  # CSS upper-cases it
    assert "ни один мост не отзывался за сутки" in page.find_element(By.ID, "status").text
    assert page.find_element(By.ID, "who").text.startswith("авторизация отключена")
    # The codes stay, their meaning in a title.
    dlq = base.row(page, one.file_id).find_element(By.CSS_SELECTOR, "td:nth-child(5) .badge")
    assert dlq.text == "dlq" and cyrillic(dlq.get_attribute("title") or "")
    code = base.row(page, one.file_id).find_element(By.CSS_SELECTOR, "td.code")
    assert code.text == "NO_ACK" and cyrillic(code.get_attribute("title") or "")
    # Dates in the Russian format: 01.12.2026, 22:51:18 GMT+…
    updated = base.row(page, one.file_id).find_element(By.CSS_SELECTOR, "td.when").text
    assert re.match(r"\d\d\.\d\d\.\d{4}, \d\d:\d\d:\d\d", updated), updated

    # The batch retry answers in Russian.
    for upload_ in (one, two, running):
        base.click_in_row(page, upload_.file_id, "input.select")
    button = page.find_element(By.ID, "retry-selected")
    assert button.text == "Повторить выбранные (3)"
    button.click()
    base.wait_for(
        page,
        "an answer next to every file",
        lambda d: all(
            base.answer_of(d, u.file_id) not in ("", "повтор…") for u in (one, two, running)
        ),
    )
    assert base.answer_of(page, one.file_id) == "повторено: попытка 2 в очереди"
    assert base.answer_of(page, running.file_id) == "пропущено: ещё обрабатывается (queued)"
    assert page.find_element(By.ID, "batch-summary").text == "файлов: 3; повторено: 2, пропущено: 1"
    base.wait_for(
        page,
        "the status after the retries",
        lambda d: (
            d.find_element(By.CSS_SELECTOR, '#status [data-job-status="queued"]').text == "queued 3"
        ),
    )
    base.wait_for(
        page, "the charts", lambda d: len(d.find_elements(By.CSS_SELECTOR, base.HOUR)) == 60
    )
    assert english_left(page) == []
    shot = os.environ.get("CONSOLE_SCREENSHOT_RU")
    if shot:
        base.screenshot(page, shot)

    # The file page too.
    base.click_in_row(page, two.file_id, "td.name a")
    base.wait_for(
        page,
        "the file page with both attempts",
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#attempts .attempt-card")) == 2,
    )
    base.wait_for(page, "the retry audit", lambda d: d.find_elements(By.ID, "retries"))
    text = base.visible_text(page)
    for words in ("Попытки (2)", "Повторы (1)", "подтверждено (в работе)", "попытка 1 → попытка 2"):
        assert words in text, words
    assert page.find_element(By.ID, "back").text == "← все файлы"
    assert english_left(page) == []


@browser_test
@pytest.mark.integration
def test_the_switch_changes_the_language_at_once_and_is_remembered(
    serve: Callable[..., Served], ru_page: WebDriver
) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By

    page = ru_page
    server = serve()
    [one] = base.failed(server.db_url, "ОСВ РБ Январь.xlsx")
    page.get(server.url + "/")
    base.wait_for(page, "the file listed", lambda d: len(base.rows(d)) == 1)

    def retry_text(d: Any) -> str:
        text: str = base.row(d, one.file_id).find_element(By.CSS_SELECTOR, "button.retry").text
        return text

    assert retry_text(page) == "Повторить"
    assert (
        page.find_element(By.CSS_SELECTOR, '#lang [data-lang="ru"]').get_attribute("aria-pressed")
        == "true"
    )

    page.find_element(By.CSS_SELECTOR, '#lang [data-lang="en"]').click()
    # At once, without a reload: the page's own texts and the rows.
    base.wait_for(page, "the rows in English", lambda d: retry_text(d) == "Retry")
    assert page.execute_script("return document.documentElement.lang") == "en"
    assert page.find_element(By.ID, "apply").text == "Apply filters"
    assert page.find_element(By.CSS_SELECTOR, "#filters legend").text == "File status"
    # The status panel is drawn from fetched data: it follows when the fetch the switch
    # started has answered (a loaded machine showed it still in Russian just before).
    base.wait_for(
        page,
        "the status in English",
        lambda d: "OLDEST QUEUED" in d.find_element(By.ID, "status").text,
    )
    assert page.find_element(By.ID, "who").text.startswith("authentication off")
    assert page.execute_script("return localStorage.getItem('arm-core.lang')") == "en"

    # Remembered: a reload stays in English although the browser says Russian.
    page.refresh()
    base.wait_for(page, "the list after the reload", lambda d: len(base.rows(d)) == 1)
    assert retry_text(page) == "Retry"
    assert page.execute_script("return document.documentElement.lang") == "en"
    assert page.find_element(By.CSS_SELECTOR, "header h1").text == "arm-core console"

    # And back to Russian.
    page.find_element(By.CSS_SELECTOR, '#lang [data-lang="ru"]').click()
    base.wait_for(page, "the rows in Russian", lambda d: retry_text(d) == "Повторить")
    assert page.find_element(By.ID, "apply").text == "Применить фильтры"
    # The panels drawn from fetched data (the status, the charts) follow when the fetch
    # the switch started has answered.
    left: list[str] = []

    def all_russian(d: Any) -> bool:
        left[:] = english_left(d)
        return not left

    try:
        base.wait_for(page, "every text in Russian", all_russian)
    except TimeoutException:
        pytest.fail(f"still in English after the switch: {left}")
