"""report.html in a real browser: headless Chromium (Debian's package, with its chromedriver, driven by
Selenium) opens a stand-in run's page at 1280×800 and the test reads the rendered page — the verdict block
is on the first screen, no image is broken, nothing scrolls sideways, every gate's text is there.

On CI (``CI=true``) a missing Chromium fails the test: ``.ci/run`` installs it."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.plugin.conftest import latest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or DRIVER is None:
        reason = "headless Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: .ci/run installs them", pytrace=False)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    )
    yield driver
    driver.quit()


PAGE_FACTS = """
const verdict = document.getElementById("verdict");
const box = verdict ? verdict.getBoundingClientRect() : null;
return {
  viewport: [innerWidth, innerHeight],
  verdictTop: box ? box.top : null,
  verdictBottom: box ? box.bottom : null,
  scrollWidth: document.documentElement.scrollWidth,
  clientWidth: document.documentElement.clientWidth,
  images: Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth]),
  text: document.body.innerText,
  marked: Array.from(document.querySelectorAll("td.better, td.worse")).map(td => td.innerText),
};
"""


def test_the_report_page_reads_right_in_a_real_browser(
    pytester: pytest.Pytester, standin_args: list[str], browser: Any
) -> None:
    kept = [a for a in standin_args if a not in ("-m", "short")]
    gates = [
        "--kv-fail=decode_tps[short]: >= 1",
        "--kv-fail=ttft_s[prefill]: <= +1000%",
        "--kv-fail=decode_tps[short]: float16 >= auto * 5",
    ]
    result = pytester.runpytest_subprocess(
        *kept,
        "--kv-arms=auto,float16",
        "-m",
        "short or prefill",
        "--kv-depths=200,400",
        "--kv-depth-runs=2",
        "--kv-depth-warmups=0",
        "--kv-engine-args=--standin-itl=0.002",
        *gates,
    )
    assert result.ret in (0, 1), result.stdout.str()
    run = latest(pytester)
    report = json.loads((run / "report.json").read_text())
    browser.get((run / "report.html").as_uri())
    page = browser.execute_script(PAGE_FACTS)
    assert page["viewport"] == [1280, 800]
    assert page["verdictTop"] is not None and 0 <= page["verdictTop"] < 800, page["verdictTop"]  # first screen
    assert page["scrollWidth"] <= page["clientWidth"], "the page scrolls sideways"
    assert len(page["images"]) >= 3 and all(ok and width > 0 for _, ok, width in page["images"]), page["images"]
    assert {alt for alt, _, _ in page["images"]} >= {"short", "prefill", "prefill_delta"}
    for gate in report["gates"]:
        assert gate["name"] in page["text"], gate["name"]
    assert all(cell[0] in "▲▼" for cell in page["marked"])  # better/worse carry a sign, not colour alone
    first_screen = page["text"].split("Short-context probes")[0]
    assert "Verdict" in first_screen and report["verdicts"][0] in first_screen
