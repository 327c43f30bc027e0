"""The exporter view: the numbers it reports are the database's, who may read it, and its errors."""

from __future__ import annotations

import sys

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.db import OperationalError
from django.test import Client, RequestFactory

from django_fq import services as fq
from django_fq.metrics import views
from django_fq.types import STATE_NAMES, TOTAL_NAMES

from .helpers import samples, value

pytestmark = pytest.mark.django_db

Q = "m:view"
TOKEN = "s3cret-metrics-token-for-tests"


@pytest.fixture(autouse=True)
def _urls(settings):
    settings.ROOT_URLCONF = "tests.metrics.urls"
    settings.FQ_METRICS_TOKEN = TOKEN


def scrape(**headers) -> dict:
    response = Client().get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    assert "no-cache" in response["Cache-Control"]
    return samples(response.content.decode())


def test_values_follow_enqueue_claim_ack_nack_and_dead():
    fq.configure(Q, max_attempts=2, backoff_ms=0)
    for n in range(4):
        fq.enqueue(Q, {"n": n}, idempotency=f"t{n}")
    assert fq.enqueue(Q, {"n": 0}, idempotency="t0").created is False  # deduplicated
    fq.enqueue(Q, {"later": True}, delay_ms=3_600_000)
    a, b, c = fq.claim(Q, count=3, visibility_ms=60_000)
    fq.ack(Q, a.receipt, result={"ok": 1})
    fq.nack(Q, b.receipt, error="try again")  # attempt 1 of 2, backoff 0: ready again
    fq.nack(Q, c.receipt, error="never", permanent=True)  # dead
    again = {j.id: j for j in fq.claim(Q, count=2, visibility_ms=60_000)}  # b and the fourth job
    b2 = again[b.id]
    fq.nack(Q, b2.receipt, error="again")  # attempt 2 of 2: dead

    found = scrape()
    st = fq.stats(Q)
    assert st.counts == {"waiting": 0, "scheduled": 1, "ready": 0, "running": 1, "succeeded": 1, "dead": 2, "cancelled": 0}
    for state in STATE_NAMES:
        assert value(found, "fq_queue_jobs", queue=Q, state=state) == st.counts[state], state
    for name in TOTAL_NAMES:
        assert value(found, f"fq_queue_{name}_total", queue=Q) == st.totals[name], name
    assert st.totals["enqueued"] == 5 and st.totals["deduplicated"] == 1
    assert st.totals["claimed"] == 5 and st.totals["acked"] == 1 and st.totals["nacked"] == 3 and st.totals["dead"] == 2
    assert value(found, "fq_queue_wait_seconds_count", queue=Q) == st.wait_count == 5
    assert value(found, "fq_queue_wait_seconds_sum", queue=Q) == pytest.approx(st.wait_ms_sum / 1000)
    assert value(found, "fq_queue_run_seconds_count", queue=Q) == st.run_count == 1
    assert value(found, "fq_queue_run_seconds_sum", queue=Q) == pytest.approx(st.run_ms_sum / 1000)
    assert value(found, "fq_queue_overdue_leases", queue=Q) == 0
    assert value(found, "fq_queue_oldest_ready_age_seconds", queue=Q) == 0  # nothing ready
    assert value(found, "fq_queue_concurrency_limit", queue=Q) == 0


def test_every_queue_is_reported_and_a_deleted_one_disappears():
    fq.configure("m:one", concurrency=3, key_concurrency=2, rate_limit=5, rate_window_ms=2000, key_rate_limit=3)
    fq.enqueue("m:two", {})
    found = scrape()
    assert value(found, "fq_queue_concurrency_limit", queue="m:one") == 3
    assert value(found, "fq_queue_key_concurrency_limit", queue="m:one") == 2
    assert value(found, "fq_queue_key_concurrency_limit", queue="m:two") == 0
    assert value(found, "fq_queue_rate_limit_per_second", queue="m:one") == 2.5
    assert value(found, "fq_queue_rate_limit_per_second", queue="m:two") == 0
    assert value(found, "fq_queue_key_rate_limit_per_second", queue="m:one") == 1.5
    assert value(found, "fq_queue_key_rate_limit_per_second", queue="m:two") == 0
    assert value(found, "fq_queue_jobs", queue="m:two", state="ready") == 1
    fq.delete_queue("m:two")
    found = scrape()
    assert not [k for k in found if ("queue", "m:two") in k[1]]


def test_the_paused_gauge_follows_pause_and_resume(settings):
    fq.configure("m:one")
    fq.configure("m:two")
    assert value(scrape(), "fq_queue_paused", queue="m:one") == 0
    fq.pause("m:one")
    found = scrape()
    assert (value(found, "fq_queue_paused", queue="m:one"), value(found, "fq_queue_paused", queue="m:two")) == (1, 0)
    fq.resume("m:one")
    assert value(scrape(), "fq_queue_paused", queue="m:one") == 0

    # Past FQ_METRICS_MAX_QUEUES the folded queues report how many of them are paused.
    settings.FQ_METRICS_MAX_QUEUES = 1
    for name in ("m:three", "m:four"):
        fq.configure(name)
        fq.pause(name)
    found = scrape()
    assert value(found, "fq_queue_paused", queue="(other)") == 2
    assert not [k for k in found if k[0] == "fq_queue_paused" and ("queue", "m:two") in k[1]]


def test_oldest_ready_age_and_overdue_leases_use_the_database_clock(clock):
    fq.configure(Q, backoff_ms=0)
    fq.enqueue(Q, {"wait": True})
    fq.enqueue(Q, {"run": True})
    fq.enqueue(Q, {"later": True}, delay_ms=3_600_000)  # scheduled: never counted as ready
    assert len(fq.claim(Q, visibility_ms=1000)) == 1
    clock.advance(30_000)
    found = scrape()
    age = value(found, "fq_queue_oldest_ready_age_seconds", queue=Q)
    assert 30 <= age < 3600
    assert value(found, "fq_queue_overdue_leases", queue=Q) == 1
    assert fq.reap(Q).expired == 1
    found = scrape()
    assert value(found, "fq_queue_overdue_leases", queue=Q) == 0
    assert value(found, "fq_queue_expired_total", queue=Q) == 1
    assert value(found, "fq_queue_jobs", queue=Q, state="ready") == 2


def test_openmetrics_when_the_scraper_asks_for_it():
    fq.enqueue(Q, {})
    response = Client().get(
        "/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0"
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    text = response.content.decode()
    assert text.rstrip().endswith("# EOF")
    assert f'fq_queue_enqueued_total{{queue="{Q}"}} 1.0' in text


# --- who may read it --------------------------------------------------------------------------------


def test_without_credentials_it_is_forbidden_and_says_how_to_get_in():
    fq.enqueue(Q, {})
    response = Client().get("/metrics/")
    assert response.status_code == 403
    assert b"FQ_METRICS_TOKEN" in response.content and b"staff" in response.content
    assert Q.encode() not in response.content


@pytest.mark.parametrize("header", ["Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer ", ""])
def test_a_wrong_token_is_forbidden(header):
    assert Client().get("/metrics/", HTTP_AUTHORIZATION=header).status_code == 403


def test_no_token_configured_means_no_token_is_accepted(settings):
    settings.FQ_METRICS_TOKEN = ""
    assert Client().get("/metrics/", HTTP_AUTHORIZATION="Bearer ").status_code == 403
    settings.FQ_METRICS_TOKEN = None
    assert Client().get("/metrics/", HTTP_AUTHORIZATION="Bearer None").status_code == 403


def test_public_setting_opens_it(settings):
    settings.FQ_METRICS_TOKEN = None
    settings.FQ_METRICS_PUBLIC = True
    assert Client().get("/metrics/").status_code == 200
    settings.FQ_METRICS_PUBLIC = "yes"  # only True itself opens it
    assert Client().get("/metrics/").status_code == 403


def test_staff_users_may_read_it_other_users_may_not():
    staff = User.objects.create_user("staff", is_staff=True)
    plain = User.objects.create_user("plain")
    gone = User.objects.create_user("gone", is_staff=True, is_active=False)
    rf = RequestFactory()
    for user, status in ((staff, 200), (plain, 403), (gone, 403), (AnonymousUser(), 403)):
        request = rf.get("/metrics/")
        request.user = user
        assert views.metrics_view(request).status_code == status, user


def test_only_get_and_head():
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    assert client.head("/metrics/", **auth).status_code == 200
    response = client.post("/metrics/", **auth)
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("method", ["post", "put", "delete"])
def test_with_csrf_middleware_a_post_still_gets_405_not_the_csrf_page(settings, method):
    settings.MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ]
    client = Client(enforce_csrf_checks=True)
    response = getattr(client, method)("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"
    assert response.content == b"use GET\n"


# --- errors ----------------------------------------------------------------------------------------------


def test_without_prometheus_client_it_answers_503_with_the_fix(monkeypatch):
    monkeypatch.setattr(views, "_registry", None)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "prometheus_client.exposition", None)
    response = Client().get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 503
    assert b"prometheus-client" in response.content and b"django-fq[metrics]" in response.content


def test_a_database_error_answers_503_not_a_traceback(monkeypatch):
    def broken():
        raise OperationalError("could not connect to server: Connection refused\nIs the server running?")

    monkeypatch.setattr(fq, "queues", broken)
    response = Client().get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 503
    assert response.content == b"unavailable: database error: could not connect to server: Connection refused\n"
    assert response["Retry-After"] == "5"


def test_fq_database_naming_a_missing_alias_answers_503_not_a_500(settings):
    fq.configure(Q)
    settings.FQ_DATABASE = "queue"  # a typo, or an alias only production has
    response = Client().get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 503
    assert response.content == b"unavailable: FQ_DATABASE='queue' is not in DATABASES\n"
    assert response["Retry-After"] == "5"


def test_waiting_jobs_are_reported_and_leave_the_state_when_released():
    up = fq.enqueue(Q, {"first": True}).id
    fq.enqueue(Q, {"second": True}, depends_on=[up])
    found = scrape()
    assert value(found, "fq_queue_jobs", queue=Q, state="waiting") == 1
    assert value(found, "fq_queue_jobs", queue=Q, state="ready") == 1
    (job,) = fq.claim(Q, visibility_ms=60_000)
    fq.ack(Q, job.receipt)
    found = scrape()
    assert value(found, "fq_queue_jobs", queue=Q, state="waiting") == 0
    assert value(found, "fq_queue_jobs", queue=Q, state="ready") == 1


def _batches(found, queue):
    return (
        {s: value(found, "fq_queue_batches", queue=queue, state=s) for s in ("open", "sealed", "finished", "cancelled")},
        {s: value(found, "fq_queue_batch_members", queue=queue, state=s) for s in ("succeeded", "dead", "cancelled", "unfinished")},
    )


def test_batch_progress_follows_the_members_and_the_seal(settings):
    from django_fq import batches

    fq.configure("m:plain")
    b = batches.create("m:batch", callback={"queue": "m:reports", "payload": {}})
    done = batches.create("m:batch")
    batches.seal(done.id)  # empty: finished at once
    ids = [r.id for r in batches.add(b.id, [{"payload": n} for n in range(4)])]
    found = scrape()
    assert _batches(found, "m:batch") == (
        {"open": 1, "sealed": 0, "finished": 1, "cancelled": 0},
        {"succeeded": 0, "dead": 0, "cancelled": 0, "unfinished": 4},
    )
    assert not [k for k in found if k[0].startswith("fq_queue_batch") and ("queue", "m:plain") in k[1]]

    first, second = fq.claim("m:batch", count=2, visibility_ms=60_000)
    fq.ack("m:batch", first.receipt)
    fq.nack("m:batch", second.receipt, error="no", permanent=True)
    fq.cancel("m:batch", ids[3])
    batches.seal(b.id)
    assert _batches(scrape(), "m:batch") == (
        {"open": 0, "sealed": 1, "finished": 1, "cancelled": 0},
        {"succeeded": 1, "dead": 1, "cancelled": 1, "unfinished": 1},
    )
    (last,) = fq.claim("m:batch", visibility_ms=60_000)
    fq.ack("m:batch", last.receipt)
    assert batches.get(b.id).state == "finished"
    # Finished batches leave the members' gauge (it is the progress of those still in progress).
    assert _batches(scrape(), "m:batch") == (
        {"open": 0, "sealed": 0, "finished": 2, "cancelled": 0},
        {"succeeded": 0, "dead": 0, "cancelled": 0, "unfinished": 0},
    )

    # Past FQ_METRICS_MAX_QUEUES the folded queues' batches are summed under "(other)".
    settings.FQ_METRICS_MAX_QUEUES = 0
    open_one = batches.create("m:plain")
    batches.add(open_one.id, [{"payload": 1}])
    found = scrape()
    assert _batches(found, "(other)") == (
        {"open": 1, "sealed": 0, "finished": 2, "cancelled": 0},
        {"succeeded": 0, "dead": 0, "cancelled": 0, "unfinished": 1},
    )
    assert not [k for k in found if k[0].startswith("fq_queue_batch") and ("queue", "m:batch") in k[1]]
