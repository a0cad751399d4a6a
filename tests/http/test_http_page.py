"""The web page in a real headless browser: Debian's chromium driven through chromium-driver by
selenium, against the server process with the tiny checkpoint on the CPU.  The page loads, lists
the voices with their descriptions, speaks a text (played through Web Audio as it streams) and
leaves the clip in its <audio> element; it asks for the API key when the server wants one.

.ci/run installs chromium and chromium-driver; without them the tests fail on CI and skip elsewhere.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import browser  # noqa: F401  (a fixture)
from http_server import HttpServer, start_http
from tiny_server import start_tiny
from voice_clip import write_clip

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Iterator[HttpServer]:
    args = ["--max-frames", "8", "--first-chunk-frames", "1", "--chunk-frames", "2", "--greedy", "--seed", "1"]
    http = start_tiny(tmp_path_factory.mktemp("page"), tiny_checkpoint, *args, name="page", http=True)
    yield http
    assert http.server.stop() == 0


def wait(driver: object, condition: str, timeout: float = 60) -> object:
    """Wait until a JavaScript expression is truthy; returns its value."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: d.execute_script(f"return {condition}"))


def test_page_speaks_with_a_chosen_voice(browser: object, real: HttpServer, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d = browser
    d.get(f"{real.url}/")  # type: ignore[attr-defined]
    assert wait(d, "document.getElementById('model-status').dataset.state === 'ready'")
    wait(d, "document.querySelectorAll('#voice option').length > 0")
    options = [o.get_attribute("value") for o in d.find_elements(By.CSS_SELECTOR, "#voice option")]  # type: ignore[attr-defined]
    assert options[:9] == ["vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee"]
    assert options[9:] == ["ryan-calm"]

    Select(d.find_element(By.ID, "voice")).select_by_value("ryan-calm")  # type: ignore[attr-defined]
    info = d.find_element(By.ID, "voice-info").text  # type: ignore[attr-defined]
    assert "languages: en" in info and "Speak slowly and calmly." in info
    Select(d.find_element(By.ID, "voice")).select_by_value("ryan")  # type: ignore[attr-defined]
    assert "English; dynamic male" in d.find_element(By.ID, "voice-info").text  # type: ignore[attr-defined]

    text = d.find_element(By.ID, "text")  # type: ignore[attr-defined]
    text.clear()
    text.send_keys("Hello from the browser.")
    d.find_element(By.ID, "instructions").send_keys("Speak cheerfully.")  # type: ignore[attr-defined]
    d.find_element(By.ID, "speak-button").click()  # type: ignore[attr-defined]
    wait(d, "['done', 'error'].includes(document.getElementById('speak-status').dataset.state)", timeout=120)
    status = d.find_element(By.ID, "speak-status")  # type: ignore[attr-defined]
    assert status.get_attribute("data-state") == "done", status.text
    # The stream was played as it came (Web Audio), then kept as a clip in the <audio> element.
    assert int(status.get_attribute("data-live-buffers")) >= 1
    duration = wait(d, "document.getElementById('player').duration")
    assert 0.08 <= float(duration) <= 8 * 0.08 + 0.01  # whole 80 ms frames, at most --max-frames
    assert d.execute_script("return document.getElementById('player').src").startswith("blob:")  # type: ignore[attr-defined]
    assert "first audio after" in status.text

    shot = tmp_path / "page.png"
    d.save_screenshot(str(shot))  # type: ignore[attr-defined]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    if os.environ.get("Q3T_PAGE_SCREENSHOT"):  # how docs/web-page.png is made
        shutil.copy(shot, os.environ["Q3T_PAGE_SCREENSHOT"])

    spoken = real.server.log_text()
    assert "voice=ryan chars=23" in spoken and "format=pcm (http)" in spoken
    d.find_element(By.CSS_SELECTOR, "nav a[data-panel=voices]").click()  # type: ignore[attr-defined]
    rows = d.find_elements(By.CSS_SELECTOR, "#voice-table tbody tr")  # type: ignore[attr-defined]
    assert len(rows) == 10 and "preset" in rows[-1].text
    d.find_element(By.CSS_SELECTOR, "nav a[data-panel=speak]").click()  # type: ignore[attr-defined]

    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]  # type: ignore[attr-defined]
    assert errors == []


def test_page_asks_for_the_api_key(browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    http = start_http(tmp_path, [], fake=True, key="page-key")
    try:
        d = browser
        d.get(f"{http.url}/")  # type: ignore[attr-defined]
        d.execute_script("localStorage.clear()")  # type: ignore[attr-defined]
        d.refresh()  # type: ignore[attr-defined]
        wait(d, "!document.getElementById('key-panel').hidden")
        d.find_element(By.ID, "api-key").send_keys("page-key")  # type: ignore[attr-defined]
        d.find_element(By.CSS_SELECTOR, "#key-form button").click()  # type: ignore[attr-defined]
        wait(d, "document.querySelectorAll('#voice option').length === 10")
        d.find_element(By.ID, "speak-button").click()  # type: ignore[attr-defined]
        wait(d, "document.getElementById('speak-status').dataset.state === 'done'")
        assert float(wait(d, "document.getElementById('player').duration")) > 0
    finally:
        assert http.server.stop() == 0


@pytest.mark.slow
def test_page_adds_and_removes_a_cloned_voice(browser: object, tmp_path: Path, tiny_base_checkpoint: Path) -> None:
    """With a Base model: the Voices panel's form uploads a clip and its transcript, the voice appears in the
    table and the voice menu, speaks, and its Remove button takes it away again. A screenshot goes to docs/."""
    from selenium.webdriver.common.by import By

    args = ["--max-frames", "6", "--first-chunk-frames", "1", "--chunk-frames", "2", "--seed", "1"]
    http = start_tiny(
        tmp_path, tiny_base_checkpoint, *args, "--data-dir", str(tmp_path / "data"), name="page-base", http=True
    )
    try:
        d = browser
        d.get(f"{http.url}/#voices")  # type: ignore[attr-defined]
        assert wait(d, "document.getElementById('model-status').dataset.state === 'ready'")
        assert wait(d, "!document.getElementById('voice-admin').hidden")
        d.find_element(By.ID, "new-voice-name").send_keys("anna")  # type: ignore[attr-defined]
        d.find_element(By.ID, "new-voice-audio").send_keys(str(write_clip(tmp_path / "anna.wav")))  # type: ignore[attr-defined]
        d.find_element(By.ID, "new-voice-text").send_keys("Hello there, this is Anna.")  # type: ignore[attr-defined]
        d.find_element(By.ID, "new-voice-button").click()  # type: ignore[attr-defined]
        assert wait(d, "document.getElementById('voice-admin-status').textContent.startsWith('Added')", 120)
        assert wait(
            d, "[...document.querySelectorAll('#voice-table tbody tr')].some(r => r.cells[0].textContent === 'anna')"
        )
        assert d.execute_script("return [...document.querySelectorAll('#voice option')].map(o => o.value)") == ["anna"]  # type: ignore[attr-defined]
        shots = Path(os.environ.get("Q3T_SCREENSHOT_DIR", tmp_path))  # Q3T_SCREENSHOT_DIR=docs: the README's picture
        assert d.save_screenshot(str(shots / "page-voices.png"))  # type: ignore[attr-defined]
        d.find_element(By.CSS_SELECTOR, "button.remove-voice[data-voice='anna']").click()  # type: ignore[attr-defined]
        assert wait(d, "document.getElementById('voice-admin-status').textContent.startsWith('Removed')")
        assert wait(d, "document.querySelectorAll('#voice-table tbody tr').length === 0")
        assert not any((tmp_path / "data" / "voices").glob("anna.*"))
    finally:
        assert http.server.stop() == 0
