"""The search server's page as a person uses it, in headless Chromium (Debian's chromium and chromium-driver,
driven by selenium; nothing is downloaded): the real server on a free loopback port with an access token, the
page asks for it, a query uploaded, the results shown, the top match the API's, a result clicked to search
from it, the page at a phone's width; screenshots saved ($REID_SCREENSHOTS, else the test's folder).

`make test` installs the browser (make browser) and sets REID_BROWSER_TEST=1 for the torch suite: there a
missing browser or driver fails the test; elsewhere it is skipped."""
import os

import pytest

from tests.test_retrieval import DEMO, _one_torch_thread, opts_for  # noqa: F401
from tests.test_serve import index_file, post_image, queries, start_server, world  # noqa: F401

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,860"]
TOKEN = "page-test-token"


def browser_or_why():
    """(selenium's webdriver module, None), or (None, everything that is missing)."""
    missing = []
    for module, where in (("fastapi", "requirements-torch.txt"), ("selenium", "requirements-torch.txt")):
        try:
            __import__(module)
        except ImportError:
            missing.append("the Python module %s (%s)" % (module, where))
    absent = [path for path in (CHROMIUM, DRIVER) if not os.path.exists(path)]
    if absent:
        missing.append("%s (apt-get install chromium chromium-driver, or make browser)" % " and ".join(absent))
    if missing:
        return None, "; ".join(missing)
    from selenium import webdriver
    return webdriver, None


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    """The browser; session-scoped and first in the test's arguments, so that a missing browser is reported
    before the session's synthetic data and model are made."""
    webdriver, why = browser_or_why()
    if webdriver is None:
        if os.environ.get("REID_BROWSER_TEST") == "1":
            pytest.fail("the page's browser test was asked for (REID_BROWSER_TEST=1) and cannot run: missing " + why)
        pytest.skip("no browser here: missing %s; the torch suite of make test runs this test" % why)
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + ["--user-data-dir=%s" % tmp_path_factory.mktemp("chromium-profile")]:
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(DRIVER), options=options)
    browser.set_page_load_timeout(60)
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def server(index_file):  # noqa: F811
    env = dict(os.environ, ACL_REID_TOKEN=TOKEN)
    proc, url = start_server(["--index", index_file, "--engine", "eager", "--batch", "4", "--log-level", "warning"],
                             env=env)
    yield url
    proc.terminate()
    assert proc.wait(60) == 0


def shots(tmp_path):
    folder = os.environ.get("REID_SCREENSHOTS") or str(tmp_path)
    os.makedirs(folder, exist_ok=True)
    return folder


def test_the_page_searches_as_a_person_would(driver, server, world, tmp_path):  # noqa: F811
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
    wait = WebDriverWait(driver, 60)
    query = queries(world, 3)[2]
    headers = {"Authorization": "Bearer " + TOKEN}
    expected = post_image(httpx, query, "?topk=10", base=server.rstrip("/"), headers=headers, timeout=60).json()

    # without the token the page asks for it; given, it shows the index
    driver.get(server)
    wait.until(ec.visibility_of_element_located((By.ID, "login")))
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.ID, "token-go").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "chips"), "69 gallery images"))

    # a query chosen through the file input: the results are the API's, thumbnails loaded
    driver.find_element(By.ID, "file").send_keys(query)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#grid .match")) == 10)
    cards = driver.find_elements(By.CSS_SELECTOR, "#grid .match")
    assert [c.get_attribute("data-path") for c in cards] == [m["path"] for m in expected["matches"]]
    assert cards[0].get_attribute("data-id") == str(expected["matches"][0]["id"])
    assert "%.3f" % expected["matches"][0]["score"] in cards[0].text
    loaded = "return Array.from(document.querySelectorAll('#grid .match img')).every(i => i.naturalWidth > 0)"
    wait.until(lambda d: d.execute_script(loaded))
    assert "Top 10 for %s" % os.path.basename(query) in driver.find_element(By.ID, "rtitle").text
    driver.save_screenshot(os.path.join(shots(tmp_path), "serve_page.png"))

    # a result clicked: searched again from that gallery image, which comes first, as itself
    second = cards[1].get_attribute("data-id")
    path = cards[1].get_attribute("data-path")
    cards[1].click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "rtitle"), os.path.basename(path)))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#grid .match")
               and d.find_elements(By.CSS_SELECTOR, "#grid .match")[0].get_attribute("data-id") == second)

    # the token given in the address's fragment (a fresh load, the stored token gone): the page keeps it and drops
    # it from the address
    driver.execute_script("sessionStorage.clear()")
    driver.get("about:blank")
    driver.get(server + "#token=" + TOKEN)
    wait.until(ec.text_to_be_present_in_element((By.ID, "chips"), "69 gallery images"))
    assert "token" not in driver.current_url and not driver.find_element(By.ID, "login").is_displayed()

    # a phone's screen (390 x 844 CSS pixels, emulated): one column, nothing wider than the screen
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844,
                                                                   "deviceScaleFactor": 2, "mobile": True})
    try:
        driver.get(server)
        wait.until(ec.text_to_be_present_in_element((By.ID, "chips"), "69 gallery images"))
        driver.find_element(By.ID, "file").send_keys(query)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#grid .match")) == 10)
        assert driver.execute_script("return window.innerWidth") == 390
        assert driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        lefts = driver.execute_script("return [document.querySelector('aside').getBoundingClientRect().left, "
                                      "document.querySelector('section').getBoundingClientRect().left]")
        assert abs(lefts[0] - lefts[1]) < 1          # the query panel above the results, not beside them
        driver.save_screenshot(os.path.join(shots(tmp_path), "serve_page_phone.png"))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_a_missing_browser_fails_where_it_was_asked_for(tmp_path):
    """REID_BROWSER_TEST=1 turns a missing browser into a failure, not a skip (what `make test` relies on): the
    test above run in a fresh pytest whose plugin points CHROMIUM nowhere."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    plugin = "import tests.test_serve_browser as t\nt.CHROMIUM = '/nonexistent/chromium'\n"
    (tmp_path / "no_browser.py").write_text(plugin)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    for asked, outcome in (("1", "1 error"), ("", "1 skipped")):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p",
                               "no_browser", "tests/test_serve_browser.py::test_the_page_searches_as_a_person_would"],
                              capture_output=True, text=True, timeout=600, env=dict(env, REID_BROWSER_TEST=asked),
                              cwd=root)
        assert outcome in proc.stdout, proc.stdout[-2000:]
        assert "/nonexistent/chromium (apt-get install chromium chromium-driver" in proc.stdout, proc.stdout[-2000:]
