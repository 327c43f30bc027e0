"""The admin in a real headless browser (Chromium driven by Selenium) against a live server.

Slow tier (``@pytest.mark.slow``): logging in, the queue list, a retry action, live updates
of the dashboard and the job list, the queue controls in place, a view-only user,
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

from ..headless import HEADLESS_FLAGS
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

CHROME_FLAGS = (*HEADLESS_FLAGS, "--window-size=1400,1000")
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


def _login(browser, site, next_path: str, user: User | None = None) -> None:
    """Log in as ``user`` (with the password PASSWORD), by default a new superuser ``boss``."""
    from selenium.webdriver.common.by import By

    if user is None:
        user = User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    browser.delete_all_cookies()
    browser.get(f"{site.url}/admin/login/?next={next_path}")
    browser.find_element(By.NAME, "username").send_keys(user.username)
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


def test_search_and_cancel_every_match(browser, site):
    """Search by queue in the form, then cancel all 5,000 matches: the page steps through them by itself."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from django_fq.models import Job

    done = make("web:bulk", "succeeded")  # refused: a succeeded job cannot be cancelled
    for start in range(0, 5000, 1000):
        fq.enqueue_many("web:bulk", [{"payload": {"n": n}} for n in range(start, start + 1000)])
    fq.enqueue("web:other", {"n": 1})
    _login(browser, site, "/admin/django_fq/job/")
    browser.find_element(By.CSS_SELECTOR, "details.fq-search summary").click()
    browser.find_element(By.NAME, "fq-queue").send_keys("web:bulk")
    Select(browser.find_element(By.NAME, "fq-state")).select_by_value("")
    browser.find_element(By.CSS_SELECTOR, "#fq-search-form [type=submit]").click()
    _wait(browser, "#fq-search-summary")
    assert "fq-queue=web%3Abulk" in browser.current_url
    assert len(browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 50
    browser.find_element(By.ID, "fq-bulk-cancel").click()
    assert _wait(browser, "#fq-bulk-total").text == "5001 matching jobs."
    browser.find_element(By.ID, "fq-bulk-start").click()
    _wait(browser, "#fq-bulk-finished", timeout=900)  # bulk.js posted each next step
    assert browser.find_element(By.ID, "fq-bulk-done").text == "5000"
    assert browser.find_element(By.ID, "fq-bulk-refused").text == "1"
    assert "job is succeeded" in browser.find_element(By.ID, "fq-bulk-reasons").text
    assert Job.objects.filter(queue__name="web:bulk", state="cancelled").count() == 5000
    assert fq.get("web:bulk", done).state == "succeeded"
    assert fq.get("web:other", Job.objects.get(queue__name="web:other").uid).state == "ready"
    # The browser asks for /favicon.ico on its own, which the admin does not serve.
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "/favicon.ico" not in e["message"]]
    assert errors == [], errors


# --- live updates and controls in place (docs/admin.md "Live updates", "Queue controls") ---------


def _console_errors(browser) -> list:
    # The browser asks for /favicon.ico on its own, which the admin does not serve.
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "/favicon.ico" not in e["message"]]


def _until(browser, predicate, timeout: float = 20):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.1).until(lambda _: predicate())


def _navigates(browser, act) -> None:
    """Run ``act`` (a click, a key press), then wait until the browser has left the current page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    page = browser.find_element(By.TAG_NAME, "html")
    act()
    WebDriverWait(browser, 20).until(ec.staleness_of(page))


def _polls(browser) -> int:
    """How many times the page's script asked its JSON view (``fetch`` calls since :func:`_count_polls`)."""
    return browser.execute_script("return window.__fqPolls || 0")


def _count_polls(browser) -> None:
    browser.execute_script(
        "window.__fqPolls = 0; var f = window.fetch;"
        "window.fetch = function () { window.__fqPolls += 1; return f.apply(this, arguments); };"
    )


def _idle_periods(browser, periods: int, interval_ms: int) -> None:
    """Let ``periods`` poll intervals pass in the page's own clock (to show that nothing happens meanwhile)."""
    browser.set_script_timeout(periods * interval_ms / 1000 + 30)
    browser.execute_async_script("var done = arguments[arguments.length - 1]; setTimeout(done, arguments[0]);", periods * interval_ms)


def _open_live(browser, site, path: str) -> None:
    """Log in, open ``path`` with live updates not paused (a clean ``localStorage``), wait for the live bar."""
    _login(browser, site, path)
    browser.execute_script("window.localStorage.clear()")
    _navigates(browser, browser.refresh)
    _wait(browser, "#fq-live:not([hidden])")
    assert _console_errors(browser) == []


@pytest.fixture
def fast_live(monkeypatch):
    """Pages poll every second (the live server runs in this process)."""
    from django_fq.admin import live

    monkeypatch.setattr(live, "INTERVAL_S", 1)
    return 1000


def test_live_dashboard_counts_change_after_an_enqueue_and_pause_stops_them(browser, site, fast_live):
    from selenium.webdriver.common.by import By

    fq.enqueue("web:live", {"n": 0})
    fq.configure("web:quiet")  # two queues: the page has its "all queues" row
    _open_live(browser, site, "/admin/django_fq/queue/dashboard/")
    cell = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="web:live"] td.fq-count-ready')
    assert cell.text == "1"
    fq.enqueue("web:live", {"n": 1})
    _until(browser, lambda: cell.text == "2")
    assert browser.find_element(By.CSS_SELECTOR, "#fq-queue-table tfoot td.fq-total-ready").text == "2"
    assert "web:live ready 2 (was 1)" in browser.find_element(By.ID, "fq-live-status").text
    assert browser.find_element(By.ID, "fq-live-time").text.endswith("UTC")
    # The link that appeared goes to the queue's ready jobs.
    assert "state=ready" in cell.find_element(By.TAG_NAME, "a").get_attribute("href")

    # Pause (by keyboard: the button takes focus and Enter), then the state survives a reload.
    toggle = browser.find_element(By.ID, "fq-live-toggle")
    toggle.send_keys("\n")
    assert toggle.text == "Resume live updates"
    _navigates(browser, browser.refresh)
    toggle = _wait(browser, "#fq-live:not([hidden]) #fq-live-toggle")
    assert toggle.text == "Resume live updates"
    assert browser.find_element(By.ID, "fq-live-state").text == "Live updates paused."
    _count_polls(browser)
    fq.enqueue("web:live", {"n": 2})
    _idle_periods(browser, 3, fast_live)
    cell = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="web:live"] td.fq-count-ready')
    assert cell.text == "2" and _polls(browser) == 0  # three intervals passed without a poll
    toggle.click()  # resume: one poll at once
    _until(browser, lambda: cell.text == "3")
    assert _console_errors(browser) == []
    browser.execute_script("window.localStorage.clear()")


def test_live_job_list_shows_new_matches_and_row_states(browser, site, fast_live):
    from selenium.webdriver.common.by import By

    from django_fq.models import Job

    first = fq.enqueue("web:list", {"n": 0}).id
    _open_live(browser, site, "/admin/django_fq/job/?state=ready")
    new = browser.find_element(By.ID, "fq-live-new")
    assert not new.is_displayed()
    fq.enqueue("web:list", {"n": 1})
    fq.enqueue("web:list", {"n": 2})
    _until(browser, lambda: new.is_displayed() and new.text == "2 new jobs match: show them")
    # The listed job is claimed: its row says running, and that it left the filter.
    seq = Job.objects.get(uid=first).seq
    (job,) = fq.claim("web:list", worker="w-browser")
    assert job.id == first
    row = browser.find_element(By.XPATH, f'//tbody/tr[th/a[contains(@href, "/{seq}/change/")]]')
    badge = row.find_element(By.CSS_SELECTOR, "td.field-state_badge .fq-state")
    _until(browser, lambda: badge.text == "running")
    assert "fq-stale" in row.get_attribute("class")
    assert row.find_element(By.CSS_SELECTOR, "td.field-worker").text == "w-browser"
    _navigates(browser, new.click)
    _wait(browser, "#result_list")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 2
    assert _console_errors(browser) == []


def test_queue_controls_pause_resume_and_limits_end_to_end(browser, site, tmp_path):
    from selenium.webdriver.common.by import By

    fq.configure("web:ctl", concurrency=2)
    from django_fq.models import Queue

    pk = Queue.objects.get(name="web:ctl").pk
    _login(browser, site, "/admin/django_fq/queue/")
    assert _console_errors(browser) == []
    pause = browser.find_element(By.CSS_SELECTOR, f'button[form="fq-pause-{pk}"]')
    assert pause.text == "Pause" and pause.get_attribute("aria-label") == "Pause queue web:ctl"
    _navigates(browser, pause.click)
    assert _wait(browser, ".messagelist .success").text.startswith("Queue web:ctl paused (since ")
    assert fq.stats("web:ctl").paused is True
    resume = browser.find_element(By.CSS_SELECTOR, f'button[form="fq-pause-{pk}"]')
    assert resume.text == "Resume"
    _navigates(browser, resume.click)
    assert _wait(browser, ".messagelist .success").text == "Queue web:ctl resumed."
    assert fq.stats("web:ctl").paused is False

    # Limits: open the disclosure, change two fields, save.
    browser.find_element(By.CSS_SELECTOR, f'tr:has(button[form="fq-pause-{pk}"]) details.fq-limits summary').click()
    concurrency = browser.find_element(By.ID, f"fq-{pk}-concurrency")
    assert concurrency.get_attribute("value") == "2"
    label = browser.find_element(By.CSS_SELECTOR, f'label[for="fq-{pk}-concurrency"]')
    assert label.text == "concurrency"
    concurrency.clear()
    concurrency.send_keys("7")
    rate = browser.find_element(By.ID, f"fq-{pk}-rate_limit")
    rate.clear()
    rate.send_keys("50")
    _screenshot(browser, tmp_path, "admin-queue-controls")
    _navigates(browser, browser.find_element(By.CSS_SELECTOR, f'button[form="fq-limits-{pk}"]').click)
    message = _wait(browser, ".messagelist .success").text
    assert message == "Limits of queue web:ctl saved: concurrency 2 → 7, rate_limit 0 → 50."
    policy = fq.policy("web:ctl")
    assert (policy.concurrency, policy.rate_limit) == (7, 50)
    # Enter in a limits field submits the limits, not the pause button.
    browser.find_element(By.CSS_SELECTOR, f'tr:has(button[form="fq-pause-{pk}"]) details.fq-limits summary').click()
    field = browser.find_element(By.ID, f"fq-{pk}-key_concurrency")
    field.clear()
    _navigates(browser, lambda: field.send_keys("3\n"))
    assert "key_concurrency 0 → 3" in _wait(browser, ".messagelist .success").text
    assert fq.policy("web:ctl").key_concurrency == 3 and fq.stats("web:ctl").paused is False
    assert _console_errors(browser) == []


def test_a_view_only_user_sees_no_controls_in_the_browser(browser, site):
    from django.contrib.auth.models import Permission
    from selenium.webdriver.common.by import By

    fq.configure("web:view")
    done = make("web:view", "succeeded")
    viewer = User.objects.create_user("viewer", "viewer@example.com", PASSWORD, is_staff=True)
    viewer.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_fq", codename__in=["view_queue", "view_job"])
    )
    _login(browser, site, "/admin/django_fq/queue/", viewer)
    _wait(browser, "#result_list")
    assert browser.find_elements(By.CSS_SELECTOR, ".fq-controls, form.fq-control-form, td.field-queue_controls") == []
    from django_fq.models import Job, Queue

    browser.get(f"{site.url}/admin/django_fq/queue/{Queue.objects.get(name='web:view').pk}/change/")
    _wait(browser, "#content-main")
    assert browser.find_elements(By.ID, "fq-pause-queue") == []
    browser.get(f"{site.url}/admin/django_fq/job/{Job.objects.get(uid=done).seq}/change/")
    _wait(browser, "#content-main")
    assert browser.find_elements(By.ID, "fq-delete-job") == []
    # The dashboard still refreshes for a viewer.
    browser.get(f"{site.url}/admin/django_fq/queue/dashboard/")
    _wait(browser, "#fq-live:not([hidden])")
    assert _console_errors(browser) == []


def _page_overflow(browser) -> int:
    """How many CSS pixels the page is wider than the screen (0 or less: no sideways scrolling).

    Under mobile emulation Chromium zooms out a page wider than the screen and widens
    ``window.innerWidth`` with it, so both it and ``scrollWidth`` are compared with the layout
    viewport's width (``documentElement.clientWidth``, the device's 390 px).
    """
    return browser.execute_script(
        "var d = document.documentElement; return Math.max(d.scrollWidth, window.innerWidth) - d.clientWidth"
    )


def test_live_bar_and_controls_at_phone_width(browser, site, tmp_path):
    """At 390 px: the live bar's toggle on screen; a job's long error history and a workflow graph do not widen the page."""
    from selenium.webdriver.common.by import By

    from django_fq.workflows import Workflow

    fq.configure("web:phone", max_attempts=3)
    # A job with a long error history: a traceback with long lines, and a message with no space to break at.
    failing = fq.enqueue("web:phone", {"n": 1}).id
    trace = "Traceback (most recent call last):\n" + "\n".join(
        f'  File "/srv/app/very/long/package/path/module_{i}.py", line {i}, in handler_{i}: {"x" * 80}'
        for i in range(8)
    )
    for error in (trace, "E" * 400, "ValueError: " + "word " * 200):
        (job,) = fq.claim("web:phone", worker="worker-with-a-rather-long-name-" + "w" * 40)
        assert job.id == failing
        fq.nack("web:phone", job.receipt, error=error, delay_ms=0)
    assert fq.get("web:phone", failing).state == "dead"
    wf = Workflow()
    top = wf.step("web:phone", "a", name="extract " * 10)
    middle = [wf.step("web:phone", str(i), name=f"transform-{i}", after=[top]) for i in range(3)]
    wf.step("web:phone", "z", name="load", after=middle)
    step = wf.enqueue()[top.name]
    from .helpers import seq

    _login(browser, site, "/admin/django_fq/queue/dashboard/")
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True}
    )
    try:
        _navigates(browser, browser.refresh)
        toggle = _wait(browser, "#fq-live:not([hidden]) #fq-live-toggle")
        box = browser.execute_script("var r = arguments[0].getBoundingClientRect(); return [r.left, r.right, r.height, window.innerWidth];", toggle)
        assert box[0] >= 0 and box[1] <= box[3] and box[2] >= 44  # on screen, and a finger-sized target
        # Dark mode (the admin's toggle sets data-theme): the bar takes the admin's dark colours.
        browser.execute_script("document.documentElement.dataset.theme = 'dark'")
        bar = browser.find_element(By.ID, "fq-live")
        assert bar.value_of_css_property("color") != "rgb(51, 51, 51)"
        path = tmp_path / "admin-dashboard-phone.png"
        browser.save_screenshot(str(path))
        keep = os.environ.get("FQ_ADMIN_SCREENSHOTS")
        if keep:
            shutil.copy(path, Path(keep) / path.name)
        assert _page_overflow(browser) <= 0
        # The job's page: the error history wraps its text or scrolls inside its own box, not the page.
        browser.get(f"{site.url}/admin/django_fq/job/{seq(failing)}/change/")
        history = _wait(browser, "table.fq-history")
        assert len(history.find_elements(By.CSS_SELECTOR, "tbody tr")) == 3
        assert _page_overflow(browser) <= 0, "the job's page scrolls sideways"
        # The workflow page: the graph is wider than the phone and scrolls inside its box.
        browser.get(f"{site.url}/admin/django_fq/job/{seq(step)}/workflow/")
        graph = _wait(browser, "svg#fq-workflow-graph")
        scroll = browser.find_element(By.CSS_SELECTOR, ".fq-wf-scroll")
        assert graph.size["width"] > 390 and scroll.size["width"] < 390
        assert _page_overflow(browser) <= 0, "the workflow page scrolls sideways"
        assert _console_errors(browser) == []
    finally:
        browser.execute_script("document.documentElement.dataset.theme = ''")
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_workers_page(browser, site, tmp_path):
    """The Workers page from the app page's link: a live and a gone worker, the gone one marked (docs/admin.md)."""
    from selenium.webdriver.common.by import By

    from ..worker_rows import add_worker

    add_worker("web-1:101:aa", host="web-1", pid=101, queues=("web:mail", "web:other"), running=2)
    add_worker("web-2:202:bb", host="web-2", pid=202, gone=True)
    _login(browser, site, "/admin/django_fq/")
    browser.find_element(By.ID, "fq-workers-link").click()
    _wait(browser, "#result_list")
    rows = {
        row.find_element(By.CSS_SELECTOR, "th.field-worker_id").text: row
        for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    }
    assert set(rows) == {"web-1:101:aa", "web-2:202:bb"}
    live, gone = rows["web-1:101:aa"], rows["web-2:202:bb"]
    assert live.find_element(By.CSS_SELECTOR, "td.field-state").text == "live"
    assert live.find_element(By.CSS_SELECTOR, "td.field-queue_list").text == "web:mail, web:other"
    assert live.find_element(By.CSS_SELECTOR, "td.field-running").text == "2"
    marked = gone.find_element(By.CSS_SELECTOR, "td.field-state .fq-worker-gone")
    assert marked.text == "gone"
    # The mark is drawn in the admin's error colour, not the live one.
    assert marked.value_of_css_property("color") != live.find_element(
        By.CSS_SELECTOR, "td.field-state span"
    ).value_of_css_property("color")
    assert not browser.find_elements(By.CSS_SELECTOR, "#content-main a.addlink, .object-tools a.addlink")  # read only
    _screenshot(browser, tmp_path, "workers")
    browser.find_element(By.LINK_TEXT, "gone").click()  # the state filter
    _wait(browser, "#result_list")
    assert "state=gone" in browser.current_url
    assert [r.find_element(By.CSS_SELECTOR, "th.field-worker_id").text
            for r in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")] == ["web-2:202:bb"]  # fmt: skip
