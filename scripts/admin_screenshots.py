"""Screenshots of every admin page of django-fq, from the real pages (``make screenshots``; docs/admin.md).

    .venv-shots/bin/python scripts/admin_screenshots.py [--out docs/img/admin] [--only SLUG] [--no-docs]

What it does, start to end:

1. The example project (``example_project.settings``) on a fresh SQLite file
   in a temporary directory: migrated, then demo data written through the
   services (:func:`seed`): five queues (one paused, one rate-limited),
   finished, dead, retried, scheduled, running and cancelled jobs, a workflow
   of five steps part way through, and a batch of twelve jobs part done.
2. Django's own threaded server (static files served like ``runserver``
   does) on a free local port, in this process.
3. Headless Chromium (``/usr/bin/chromium`` with ``chromedriver``, through
   Selenium, as ``tests/admin/test_browser.py`` drives it), logged in as a
   superuser, opens each page of :func:`pages` at desktop (1280×800) and
   phone (390×844, mobile emulation) width and saves a PNG of it, up to
   :data:`MAX_HEIGHT` high, as ``<out>/<slug>-desktop.png`` and
   ``<slug>-phone.png``. With Pillow installed (the ``screenshots`` extra)
   each is reduced to 256 colours, which keeps the admin's flat colours and
   its text sharp at a third of the size.
4. The section between the ``screenshots`` markers of ``docs/admin.md`` is
   rewritten to embed every image (``--no-docs``: leave it).

**Adding a page**: every model page of the ``django_fq`` app registered on
the admin site is found by itself (its list, e.g. a Workers page); other
views (a dashboard, a chart page) are one line of :func:`pages`, which skips
a line whose URL name does not exist (yet). Each page is first fetched with
Django's test client: a page that does not answer 200 stops the script.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the example project, django_fq and tests.headless

from tests.headless import HEADLESS_FLAGS  # noqa: E402 - after the path it needs

#: (name, CSS width, CSS height, mobile emulation).
WIDTHS = (("desktop", 1280, 800, False), ("phone", 390, 844, True))
#: Tallest screenshot (CSS pixels); a longer page is cut there.
MAX_HEIGHT = {"desktop": 1400, "phone": 2000}
#: The browser tests' flags, and a stable look for images: no scroll bars, sRGB colours.
CHROME_FLAGS = (*HEADLESS_FLAGS, "--hide-scrollbars", "--force-color-profile=srgb")
USER, PASSWORD = "admin", "screenshots-only-pw"
MARK_START, MARK_END = "<!-- screenshots:start -->", "<!-- screenshots:end -->"


@dataclass
class Page:
    slug: str
    title: str
    path: str
    #: What the screenshot shows, one sentence (the caption in docs/admin.md).
    caption: str = ""


def setup(tmp: Path) -> None:
    """Django on the example project's settings with a fresh SQLite file under ``tmp``, migrated."""
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'screenshots.sqlite3'}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    os.environ.setdefault("FQ_LOG_LEVEL", "WARNING")
    os.environ["ALLOWED_HOSTS"] = "127.0.0.1,testserver"  # the browser's host, and the test client's (check)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def seed() -> dict:
    """The demo data, written through the services; returns the ids the pages need."""
    from django.contrib.auth.models import User

    from django_fq import batches
    from django_fq import services as fq
    from django_fq.workflows import Workflow

    User.objects.create_superuser(USER, "admin@example.com", PASSWORD)
    fq.configure("emails", max_attempts=3, backoff_ms=60_000)
    fq.configure("billing", max_attempts=5)
    fq.configure("webhooks", max_attempts=1, rate_limit=50, rate_window_ms=1000)
    fq.configure("reports")
    fq.configure("thumbnails")

    fq.enqueue_many(
        "emails",
        [
            {
                "payload": {"user_id": 1000 + i, "template": "welcome"},
                "metadata": {"tags": ["signup", f"tenant-{i % 3}"]},
            }
            for i in range(40)
        ],
    )
    jobs = fq.claim("emails", count=30, worker="web-1:4117")
    for job in jobs[:22]:
        fq.ack("emails", job.receipt, result={"sent": True})
    dead_job = jobs[22].id
    for job in jobs[22:25]:
        fq.nack("emails", job.receipt, error=SMTP_ERROR, permanent=True)
    for job in jobs[25:28]:  # a failed attempt: back in the queue after the backoff
        fq.nack("emails", job.receipt, error="TimeoutError: smtp.example.net did not answer within 30 s")
    fq.report_progress("emails", jobs[28].receipt, 40, "rendering the template")
    for i in range(5):
        fq.enqueue("emails", {"user_id": 2000 + i, "template": "reminder"}, delay_ms=3_600_000 * (i + 1))
    for job in fq.jobs("emails", state="ready", count=2).jobs:
        fq.cancel("emails", job.id)

    fq.enqueue_many(
        "webhooks",
        [{"payload": {"url": f"https://hooks.example.com/orders/{i}", "order": 7100 + i}} for i in range(10)],
    )
    for job in fq.claim("webhooks", count=4, worker="web-3:4301"):
        fq.nack("webhooks", job.receipt, error=WEBHOOK_ERROR.format(order=job.payload["order"]), permanent=True)
    for job in fq.claim("webhooks", count=3, worker="web-3:4301"):
        fq.ack("webhooks", job.receipt)

    fq.enqueue_many("billing", [{"payload": {"invoice": 88000 + i}} for i in range(8)])
    fq.pause("billing")

    wf = Workflow()
    extract = wf.step("reports", {"report": "monthly", "step": "extract"}, name="extract")
    sales = wf.step("reports", {"step": "sales"}, name="sales totals", after=[extract])
    stock = wf.step("reports", {"step": "stock"}, name="stock levels", after=[extract])
    pdf = wf.step("reports", {"step": "pdf"}, name="render pdf", after=[sales, stock])
    wf.step("emails", {"step": "send", "to": "finance"}, name="email finance", after=[pdf], on_failure="run")
    flow = wf.enqueue()
    for job in fq.claim("reports", count=1, worker="web-4:5000"):
        fq.ack("reports", job.receipt, result={"rows": 18250})
    sales_job = fq.claim("reports", count=1, worker="web-4:5000")
    fq.report_progress("reports", sales_job[0].receipt, 65, "summing 12 regions")

    b = batches.create("thumbnails", callback={"queue": "emails", "payload": {"notify": "thumbnails done"}})
    batches.add(b.id, [{"payload": {"image": f"uploads/{n:04d}.jpg", "size": 256}} for n in range(12)])
    batches.seal(b.id)
    done = fq.claim("thumbnails", count=8, worker="web-5:5100")
    for job in done[:7]:
        fq.ack("thumbnails", job.receipt)
    fq.nack(
        "thumbnails", done[7].receipt, error="OSError: cannot identify image file 'uploads/0007.jpg'", permanent=True
    )

    # Concurrency limits set last: the claims above took more jobs at once than they allow.
    fq.configure("emails", concurrency=8)
    fq.configure("thumbnails", concurrency=4)

    from django_fq.models import Batch, Job, Queue

    seqs = dict(Job.objects.values_list("uid", "seq"))
    return {
        "dead_job": seqs[dead_job],
        "workflow_job": seqs[flow["render pdf"]],
        "batch": Batch.objects.get(uid=b.id).pk,
        "emails": Queue.objects.get(name="emails").pk,
    }


SMTP_ERROR = """smtplib.SMTPServerDisconnected: Connection unexpectedly closed
Traceback (most recent call last):
  File "app/mail.py", line 42, in send
    conn.sendmail(sender, to, body)
  File "/usr/lib/python3.12/smtplib.py", line 876, in sendmail
    raise SMTPServerDisconnected("Connection unexpectedly closed")"""
WEBHOOK_ERROR = "requests.HTTPError: 502 Bad Gateway for url https://hooks.example.com/orders/{order}"


def pages(ids: dict) -> list[Page]:
    """Every page captured: the listed views, then each model page of django_fq found on the admin site.

    A view whose URL name does not resolve (a page not merged yet) is skipped.
    """
    from django.contrib import admin
    from django.urls import NoReverseMatch, reverse

    def url(name, *args, query=""):
        try:
            return reverse(name, args=args) + (f"?{query}" if query else "")
        except NoReverseMatch:
            return None

    listed = [
        Page("app-index", "App index", url("admin:app_list", "django_fq"), "The django-fq section of the admin."),
        Page(
            "dashboard",
            "Dashboard",
            url("admin:django_fq_dashboard"),
            "Counts of the busiest queues and the last hour's activity.",
        ),
        Page(
            "queue-list",
            "Queue list",
            url("admin:django_fq_queue_changelist"),
            "Every queue with its counts and totals.",
        ),
        Page(
            "queue",
            "Queue page",
            url("admin:django_fq_queue_change", ids["emails"]),
            "A queue's policy, counts, totals and times.",
        ),
        Page("job-list", "Job list", url("admin:django_fq_job_changelist"), "Every job, newest first."),
        Page(
            "job-search",
            "Job search",
            url("admin:django_fq_job_changelist", query="fq-queue=webhooks&fq-state=dead&fq-error=502"),
            "The job list searched by queue, state and error text.",
        ),
        Page(
            "job",
            "Job page",
            url("admin:django_fq_job_change", ids["dead_job"]),
            "A dead job: its error history and the repair buttons.",
        ),
        Page(
            "workflow",
            "Workflow graph",
            url("admin:django_fq_job_workflow", ids["workflow_job"]),
            "A workflow part way through.",
        ),
        Page("batch-list", "Batch list", url("admin:django_fq_batch_changelist"), "Batches and their progress."),
        Page(
            "batch", "Batch page", url("admin:django_fq_batch_change", ids["batch"]), "A batch's progress and members."
        ),
        Page(
            "bulk-retry",
            "Bulk action",
            url("admin:django_fq_job_bulk", "retry", query="fq-queue=webhooks&fq-state=dead"),
            "Retry every match of a search, before it starts.",
        ),
        Page(
            "history-week",
            "History, last week",
            url("admin:django_fq_dashboard", query="span=week"),
            "The dashboard's history charts over the last week.",
        ),
        # Pages of other views go here (a URL name that does not resolve yet is skipped); the
        # model pages (the Workers page among them) are found below.
    ]
    found = [p for p in listed if p.path]
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        if opts.app_label != "django_fq" or not model_admin.has_module_permission:
            continue
        path = url(f"admin:django_fq_{opts.model_name}_changelist")
        if path and not any(p.path == path for p in found):
            name = str(opts.verbose_name_plural)
            found.append(Page(f"{opts.model_name}-list", f"{name[:1].upper()}{name[1:]}", path, f"The {name} list."))
    return found


def check(found: list[Page]) -> None:
    """Each page answers 200 to a logged-in superuser (Django's test client), or the script stops."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.get(username=USER))
    for p in found:
        status = client.get(p.path).status_code
        if status != 200:
            raise SystemExit(f"{p.slug}: {p.path} answered {status}")


def serve():
    """Django's threaded WSGI server with static files on a free port of 127.0.0.1; returns (server, base URL)."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet, allow_reuse_address=False)
    server.set_app(StaticFilesHandler(get_wsgi_application()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "chromedriver"))
    driver.set_page_load_timeout(60)
    return driver


def login(driver, base: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base}/admin/login/")
    driver.find_element(By.NAME, "username").send_keys(USER)
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    WebDriverWait(driver, 30).until(ec.presence_of_element_located((By.ID, "user-tools")))


def capture(driver, base: str, page: Page, out: Path) -> list[tuple[Path, int]]:
    """The page at each width of :data:`WIDTHS`, saved as PNG; returns (file, bytes) of each."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    saved = []
    for name, width, height, mobile in WIDTHS:
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        driver.get_log("browser")  # this page's console messages only, from here on
        driver.get(base + page.path)
        WebDriverWait(driver, 30).until(ec.presence_of_element_located((By.ID, "content")))
        errors = [
            e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]
        ]
        if errors:
            print(f"  {page.slug} ({name}): console errors: {errors}", file=sys.stderr)
        full = driver.execute_script("return document.documentElement.scrollHeight")
        tall = max(height, min(int(full), MAX_HEIGHT[name]))
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": tall})
        png = driver.get_screenshot_as_png()
        path = out / f"{page.slug}-{name}.png"
        path.write_bytes(shrink(png))
        saved.append((path, path.stat().st_size))
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return saved


def shrink(png: bytes) -> bytes:
    """``png`` in 256 colours, no dithering (Pillow), or as it is without Pillow."""
    try:
        from PIL import Image
    except ImportError:
        return png
    image = Image.open(io.BytesIO(png)).convert("RGB")
    small = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    small.save(buf, format="PNG", optimize=True)
    return buf.getvalue() if buf.tell() < len(png) else png


def write_docs(found: list[Page], out: Path, doc: Path) -> None:
    """Rewrite the section between the screenshot markers of ``doc`` to embed every page's two images."""
    text = doc.read_text()
    if MARK_START not in text or MARK_END not in text:
        raise SystemExit(f"{doc}: no {MARK_START} … {MARK_END} section to fill")
    rel = os.path.relpath(out, doc.parent)
    lines = [MARK_START, ""]
    for p in found:
        lines += [
            f"### {p.title}",
            "",
            p.caption,
            "",
            f"![{p.title}, desktop width]({rel}/{p.slug}-desktop.png)",
            f'![{p.title}, phone width]({rel}/{p.slug}-phone.png){{ width="195" }}',
            "",
        ]
    lines.append(MARK_END)
    head, rest = text.split(MARK_START, 1)
    tail = rest.split(MARK_END, 1)[1]
    doc.write_text(head + "\n".join(lines) + tail)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "img" / "admin"))
    ap.add_argument("--only", default="", help="only the pages whose slug matches this regular expression")
    ap.add_argument("--no-docs", action="store_true", help="leave docs/admin.md as it is")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fq-shots-") as tmp:
        setup(Path(tmp))
        found = pages(seed())
        check(found)
        todo = [p for p in found if re.search(args.only, p.slug)]
        server, base = serve()
        driver = browser()
        total = 0
        try:
            login(driver, base)
            for p in todo:
                for path, size in capture(driver, base, p, out):
                    total += size
                    print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}  {size / 1024:6.0f} KiB")
        finally:
            driver.quit()
            server.shutdown()
            server.server_close()
    if not args.no_docs and not args.only:
        write_docs(found, out, REPO / "docs" / "admin.md")
    print(f"{len(todo)} pages, {2 * len(todo)} images, {total / 1024 / 1024:.2f} MiB")


if __name__ == "__main__":
    main()
