"""The admin in a real headless browser (Chromium driven by Selenium) against a live server.

Slow tier (``@pytest.mark.slow``): logging in, the queue list, a retry action,
the dashboard and a workflow graph (with screenshots). Needs Debian's ``chromium`` and
``chromium-driver`` packages and the ``selenium`` package (dev extra); skipped
with the reason when one is missing. ``.ci/run`` installs the browser before
the slow tier.

The server is pytest-django's :class:`~pytest_django.live_server_helper.LiveServer`,
started by this module while the admin is installed (see ``conftest.py``), so
its middleware and URLs are the admin's whatever other tests did with the
session-wide ``live_server`` fixture. Set ``FQ_ADMIN_SCREENSHOTS=DIR`` to keep
the screenshots.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from django_fq import services as fq

from .helpers import make

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    import selenium
except ImportError:  # pragma: no cover - depends on the environment
    selenium = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(selenium is None, reason="selenium is not installed (pip install -e '.[dev]')"),
    pytest.mark.skipif(
        not (CHROMIUM and CHROMEDRIVER),
        reason="headless browser missing: apt-get install -y chromium chromium-driver",
    ),
]

CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)
PASSWORD = "browser-pw-1"


@pytest.fixture(scope="module")
def server(_admin_installed):
    from pytest_django.live_server_helper import LiveServer

    srv = LiveServer("127.0.0.1")
    yield srv
    srv.stop()


@pytest.fixture
def site(server):
    server._live_server_modified_settings.enable()
    yield server
    server._live_server_modified_settings.disable()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console messages, for get_log("browser")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _wait(browser, css: str, timeout: float = 10):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def _login(browser, site, next_path: str) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    browser.delete_all_cookies()
    browser.get(f"{site.url}/admin/login/?next={next_path}")
    browser.find_element(By.NAME, "username").send_keys("boss")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    _wait(browser, "#user-tools")


def _screenshot(browser, tmp_path: Path, name: str) -> Path:
    """A full-height screenshot of the current page."""
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1400, "height": max(600, min(int(height), 4000)), "deviceScaleFactor": 1, "mobile": False},
    )
    path = tmp_path / f"{name}.png"
    browser.save_screenshot(str(path))
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    keep = os.environ.get("FQ_ADMIN_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    return path


def test_login_and_queue_list(browser, site):
    from selenium.webdriver.common.by import By

    fq.configure("web:mail", max_attempts=2)
    for state in ("succeeded", "dead", "ready"):
        make("web:mail", state)
    fq.enqueue("web:other", {"n": 1})
    browser.get(f"{site.url}/admin/django_fq/queue/")
    assert "/admin/login/" in browser.current_url  # not logged in yet
    _login(browser, site, "/admin/django_fq/queue/")
    assert browser.current_url.endswith("/admin/django_fq/queue/")
    rows = {
        row.find_element(By.CSS_SELECTOR, "th.field-name").text: row
        for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    }
    assert set(rows) == {"web:mail", "web:other"}
    mail = rows["web:mail"]
    counts = {s: mail.find_element(By.CSS_SELECTOR, f"td.field-count_{s}").text for s in ("ready", "succeeded", "dead")}
    assert counts == {"ready": "1", "succeeded": "1", "dead": "1"}
    # The dead count links to the job list filtered to that queue's dead jobs.
    mail.find_element(By.CSS_SELECTOR, "td.field-count_dead a").click()
    _wait(browser, "#result_list")
    assert "state=dead" in browser.current_url
    assert len(browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 1


def test_retry_action(browser, site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    dead = make("web:mail", "dead")
    also_dead = make("web:mail", "dead")
    _login(browser, site, "/admin/django_fq/job/?state=dead")
    boxes = browser.find_elements(By.CSS_SELECTOR, "#result_list input.action-select")
    assert len(boxes) == 2
    from django_fq.models import Job

    target = str(Job.objects.get(uid=dead).seq)
    next(b for b in boxes if b.get_attribute("value") == target).click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("retry_selected")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    message = _wait(browser, ".messagelist .success")
    assert message.text == "1 job retried."
    info = fq.get("web:mail", dead)
    assert (info.state, info.attempts) == ("ready", 0)
    assert fq.get("web:mail", also_dead).state == "dead"
    # The job's page now offers no retry, only cancel.
    browser.get(f"{site.url}/admin/django_fq/job/{target}/change/")
    buttons = [b.get_attribute("value") for b in browser.find_elements(By.CSS_SELECTOR, ".fq-repair input[type=submit]")]
    assert buttons == ["Cancel job"]
    assert "ready" in browser.find_element(By.CSS_SELECTOR, ".fq-state").text
    # The repair buttons come before the fields, so they are on screen without scrolling.
    repair = browser.find_element(By.CSS_SELECTOR, ".fq-repair").location["y"]
    assert repair < browser.find_element(By.CSS_SELECTOR, "#content-main fieldset").location["y"] < 1000


def test_dashboard(browser, site, tmp_path):
    from selenium.webdriver.common.by import By

    fq.configure("web:mail", max_attempts=3)
    for i in range(6):
        fq.enqueue("web:mail", {"n": i})
    for job in fq.claim("web:mail", count=6):
        if job.payload["n"] % 3:
            fq.ack("web:mail", job.receipt, result={"ok": True})
        else:
            fq.nack("web:mail", job.receipt, error="temporary", delay_ms=3_600_000)
    make("web:other", "dead")
    _login(browser, site, "/admin/django_fq/")
    # The app page links to the dashboard.
    browser.find_element(By.LINK_TEXT, "Queue dashboard").click()
    chart = _wait(browser, "svg#fq-activity-chart")
    assert browser.find_element(By.ID, "fq-total-finished").text == "4"
    assert browser.find_element(By.ID, "fq-total-failed").text == "3"
    assert len(chart.find_elements(By.CSS_SELECTOR, "rect.finished")) == 1
    assert len(chart.find_elements(By.CSS_SELECTOR, "rect.failed")) == 1
    assert chart.size["width"] > 400 and chart.size["height"] > 100
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="web:mail"]')
    assert row.find_element(By.CSS_SELECTOR, "td.fq-count-scheduled").text == "2"
    assert row.find_element(By.CSS_SELECTOR, "td.fq-count-succeeded").text == "4"
    # The breadcrumbs are styled by this Django's admin (an ol on 6.1+, a div before): a coloured bar.
    crumbs = browser.find_element(By.CSS_SELECTOR, "nav .breadcrumbs")
    assert crumbs.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
    # A queue with a dead job stands out in the admin's error colour.
    dead = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="web:other"] td.fq-count-dead a.fq-alert')
    assert dead.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
    shot = _screenshot(browser, tmp_path, "admin-dashboard")
    assert shot.stat().st_size > 10_000


def test_workflow_graph(browser, site, tmp_path):
    from selenium.webdriver.common.by import By

    from django_fq.workflows import Workflow

    wf = Workflow()
    top = wf.step("web:mail", "a", name="<script>alert(1)</script>")
    left = wf.step("web:mail", "b", name="render", after=[top])
    right = wf.step("web:other", "c", name="thumbnail " * 20, after=[top], on_failure="wait")
    wf.step("web:mail", "d", name="send", after=[left, right], on_failure="run")
    ids = wf.enqueue()
    from django_fq.models import Job

    seqs = dict(Job.objects.values_list("uid", "seq"))
    _login(browser, site, f"/admin/django_fq/job/{seqs[ids['render']]}/change/")
    browser.get_log("browser")  # only this page's messages from here on
    browser.find_element(By.ID, "fq-workflow-link").click()
    graph = _wait(browser, "svg#fq-workflow-graph")
    assert browser.get_log("browser") == []  # no console errors, nothing blocked
    nodes = graph.find_elements(By.CSS_SELECTOR, "a.fq-wf-node")
    assert len(nodes) == 4 and len(graph.find_elements(By.CSS_SELECTOR, "path.fq-wf-edge")) == 4
    # A hostile step name is text, not markup (an alert would have failed the page's load).
    head = graph.find_element(By.CSS_SELECTOR, f'a[data-job="{ids[top.name]}"] text.fq-wf-head')
    assert head.text.startswith("<script>alert(1)")
    # The stylesheet reached the SVG: a waiting box has its fill and a dashed border.
    rect = graph.find_element(By.CSS_SELECTOR, f'a[data-job="{ids["send"]}"] rect')
    assert rect.value_of_css_property("stroke-dasharray") not in ("none", "")
    assert graph.size["width"] > 500 and graph.size["height"] > 100
    shot = _screenshot(browser, tmp_path, "admin-workflow")
    assert shot.stat().st_size > 10_000
    # The dark theme (the admin's toggle sets data-theme): boxes keep their own fill and dark text.
    browser.execute_script("document.documentElement.dataset.theme = 'dark'")
    label = graph.find_element(By.CSS_SELECTOR, f'a[data-job="{ids["send"]}"] text.fq-wf-head')
    assert label.value_of_css_property("fill") == "rgb(31, 45, 58)"
    _screenshot(browser, tmp_path, "admin-workflow-dark")
    # Each node is a link to its job.
    graph.find_element(By.CSS_SELECTOR, f'a[data-job="{ids["send"]}"]').click()
    _wait(browser, "#fq-workflow-link")
    assert browser.current_url.endswith(f"/admin/django_fq/job/{seqs[ids['send']]}/change/")
