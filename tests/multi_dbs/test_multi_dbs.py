"""Queues over several databases (``FQ_QUEUE_DATABASES``): every face of django-fq on three aliases.

Run with ``tests.settings_multi_dbs`` (see ``tests/test_queues_over_databases.py``):
``default`` (``FQ_DATABASE``), ``second`` (queues ``two:*``, ``t2.*``) and ``lite`` (a SQLite
file, queues ``lite:*``). Every test asserts where the rows are with plain SQL on each alias,
so a verb that wrote to the wrong database fails here. docs/how-to/queues-over-databases.md.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import asdict

import pytest
from django.contrib.auth.models import User
from django.core import checks
from django.core.management import call_command
from django.db import connections, router, transaction
from django.test import Client
from rest_framework.test import APIClient

from django_fq import backup, batches, routing, workflows
from django_fq import services as fq
from django_fq.checks import check_settings
from django_fq.exceptions import InvalidDependency, JobNotFound, WrongDatabase
from django_fq.metrics.collector import QueueCollector
from django_fq.models import Job, Queue
from django_fq.types import QueuePolicy
from tests.testapp.models import Done
from tests.worker.helpers import WorkerProc

ALIASES = ["default", "second", "lite"]
pytestmark = pytest.mark.django_db(databases=ALIASES)
FQ_TABLES = {"django_fq_queue", "django_fq_job", "django_fq_lease", "django_fq_token", "django_fq_counter"}
POLICY_FORM = asdict(QueuePolicy())


class Boom(Exception):
    pass


def job_rows(alias: str, uid: str) -> list[tuple]:
    """``(uid, state)`` rows of job ``uid`` on ``alias``, read with plain SQL."""
    with connections[alias].cursor() as cur:
        cur.execute("SELECT uid, state FROM django_fq_job WHERE uid = %s", [uid])
        return [tuple(r) for r in cur.fetchall()]


def queue_rows(alias: str) -> set[str]:
    with connections[alias].cursor() as cur:
        cur.execute("SELECT name FROM django_fq_queue")
        return {r[0] for r in cur.fetchall()}


def where(uid: str) -> list[str]:
    """The aliases holding a job row ``uid``."""
    return [a for a in ALIASES if job_rows(a, uid)]


def tables(alias: str) -> set[str]:
    with connections[alias].cursor() as cur:
        return set(connections[alias].introspection.table_names(cur))


def test_three_databases_each_migrated_and_the_mapping_read():
    names = {connections[a].settings_dict["NAME"] for a in ALIASES}
    assert len(names) == 3
    assert connections["lite"].vendor == "sqlite"
    for alias in ALIASES:
        assert tables(alias) >= FQ_TABLES, alias
        assert router.allow_migrate_model(alias, Queue)
    assert routing.aliases() == ALIASES
    assert routing.alias_for("t.ok") == "default"
    assert routing.alias_for("two:x") == routing.alias_for("t2.ok") == "second"
    assert routing.alias_for("lite:x") == "lite"
    assert routing.alias_for("twox") == "default"  # "two:*" needs the colon
    assert router.db_for_read(Job) == "default"  # outside any verb: FQ_DATABASE
    with routing.using("lite"):
        assert router.db_for_read(Job) == router.db_for_write(Job) == "lite"
    assert not [e for e in checks.run_checks() if e.id.startswith("django_fq.")]


def test_every_verb_of_the_python_api_runs_on_its_queues_database():
    fq.configure("two:api", max_attempts=2, backoff_ms=0)  # copied onto its jobs at enqueue
    ids = {q: fq.enqueue(q, {"q": q}, idempotency=f"tok-{q}").id for q in ("t.api", "two:api", "lite:api")}
    assert where(ids["t.api"]) == ["default"]
    assert where(ids["two:api"]) == ["second"]
    assert where(ids["lite:api"]) == ["lite"]
    assert fq.get("two:api", ids["two:api"]).payload == {"q": "two:api"}
    with pytest.raises(JobNotFound):
        fq.get("two:api", ids["t.api"])  # a job of another database is not found through this queue
    assert fq.enqueue("lite:api", {"again": 1}, idempotency="tok-lite:api").id == ids["lite:api"]

    assert fq.policy("two:api").max_attempts == 2 and "two:api" in queue_rows("second")
    (claimed,) = fq.claim("two:api", count=5)
    assert fq.extend("two:api", claimed.receipt, visibility_ms=60_000) > 0
    fq.nack("two:api", claimed.receipt, error="first", delay_ms=0)
    (claimed,) = fq.claim("two:api")
    fq.nack("two:api", claimed.receipt, error="second")
    assert job_rows("second", ids["two:api"]) == [(ids["two:api"], "dead")]
    assert fq.retry("two:api", ids["two:api"]).state == "ready"
    (claimed,) = fq.claim("two:api")
    fq.release("two:api", claimed.receipt)
    (claimed,) = fq.claim("two:api")
    assert fq.ack("two:api", claimed.receipt, result={"ok": True}).state == "succeeded"
    assert fq.stats("two:api").totals["acked"] == 1
    assert [j.id for j in fq.jobs("two:api", state="succeeded").jobs] == [ids["two:api"]]

    (lite,) = fq.claim("lite:api")
    assert [r.state for r in fq.ack_many("lite:api", [(lite.receipt, 1)])] == ["succeeded"]
    assert job_rows("lite", ids["lite:api"]) == [(ids["lite:api"], "succeeded")]
    assert fq.cancel("t.api", ids["t.api"]).state == "cancelled"
    assert job_rows("default", ids["t.api"]) == [(ids["t.api"], "cancelled")]

    fq.pause("lite:api")
    assert fq.claim("lite:api") == [] and fq.resume("lite:api").paused is False
    fq.delete_queue("two:api")
    assert "two:api" not in queue_rows("second")
    assert {"t.api"} <= queue_rows("default") and {"lite:api"} <= queue_rows("lite")


def test_queues_reap_and_prune_cover_every_database():
    for q in ("t.all", "two:all", "lite:all"):
        fq.enqueue(q, {"n": 1})
    names = [q.name for q in fq.queues()]
    assert names == sorted(names) and {"t.all", "two:all", "lite:all"} <= set(names)
    assert {q.name: q.counts["ready"] for q in fq.queues()}["two:all"] == 1
    with routing.using("second"):
        assert {q.name for q in fq.queues()} == queue_rows("second")
    for q in ("two:all", "lite:all"):
        assert len(fq.claim(q, visibility_ms=1)) == 1
    with connections["second"].cursor() as cur:  # its lease long past: the reaper's business
        cur.execute("UPDATE django_fq_lease SET deadline = deadline - 60000")
    with connections["lite"].cursor() as cur:
        cur.execute("UPDATE django_fq_lease SET deadline = deadline - 60000")
    assert fq.reap().expired == 2  # both databases in one call
    assert fq.prune().jobs == 0

    # A queue left on a database the mapping no longer sends it to: not listed, reached inside using().
    with routing.using("default"):
        stray = fq.enqueue("two:stray", 1).id
    assert where(stray) == ["default"] and "two:stray" not in [q.name for q in fq.queues()]
    with routing.using("default"):
        fq.delete_queue("two:stray")
    assert where(stray) == [] and "two:stray" not in queue_rows("second")


def test_transactional_enqueue_keeps_its_rule_and_refuses_another_databases_transaction(
    django_capture_on_commit_callbacks,
):
    with pytest.raises(Boom), transaction.atomic(using="second"):
        gone = fq.enqueue("two:tx", {"n": 1}).id
        assert job_rows("second", gone)
        raise Boom
    assert where(gone) == []  # rolled back with the caller's transaction on its database

    with transaction.atomic():  # "default": not two:tx's database
        Done.objects.create(job_id="y" * 32)
        with pytest.raises(WrongDatabase) as err:
            fq.enqueue("two:tx", {"n": 2})
        assert err.value.field == "queue" and err.value.code == "wrong_database"
        assert "'second'" in err.value.message and "'default'" in err.value.message
        with pytest.raises(WrongDatabase):
            fq.enqueue_many("lite:tx", [{"payload": 1}])
        kept = fq.enqueue("t.tx", {"n": 3}).id  # the caller's own database: part of it
    assert where(kept) == ["default"]
    assert "two:tx" not in queue_rows("second")  # refused before anything was written
    assert "lite:tx" not in queue_rows("lite")

    ids = []
    with (
        django_capture_on_commit_callbacks(execute=True),
        transaction.atomic(),
    ):  # after the commit: allowed, as the error says
        transaction.on_commit(lambda: ids.append(fq.enqueue("two:tx", {"n": 4}).id))
    assert where(ids[0]) == ["second"]


def test_workflows_batches_and_dependencies_stay_on_one_database():
    spec = {
        "steps": [
            {"name": "a", "queue": "two:wf", "payload": 1},
            {"name": "b", "queue": "lite:wf", "payload": 2, "after": ["a"]},
        ]
    }
    with pytest.raises(WrongDatabase) as err:
        workflows.create(spec)
    assert err.value.field == "steps[b].queue"
    assert "two:wf" not in queue_rows("second") and "lite:wf" not in queue_rows("lite")
    made = workflows.create(
        {
            "steps": [
                {"name": "a", "queue": "two:wf", "payload": 1},
                {"name": "b", "queue": "t2.wf", "payload": 2, "after": ["a"]},
            ]
        }
    )
    assert where(made["a"]) == where(made["b"]) == ["second"]
    assert [s["id"] for s in workflows.show("t2.wf", made["b"]).steps] == [made["a"], made["b"]]

    with pytest.raises(WrongDatabase) as err:
        batches.create("two:b", callback={"queue": "lite:cb", "payload": 1})
    assert err.value.field == "callback.queue"
    b = batches.create("two:b", callback={"queue": "t2.cb", "payload": 1})
    batches.add(b.id, [{"payload": 1}])
    assert batches.get(b.id).total == 1  # found without its queue: asked alias by alias
    assert [x.id for x in batches.list_batches()] == [b.id]

    upstream = fq.enqueue("lite:dep", 1).id
    with pytest.raises(InvalidDependency) as err:
        fq.enqueue("two:dep", 2, depends_on=[upstream])  # a job of another database
    assert err.value.field.startswith("depends_on")


def test_cli_json_routes_by_queue_and_lists_every_database():
    def fq_json(*argv):
        out = io.StringIO()
        call_command("fq", *argv, "--json", stdout=out, stderr=io.StringIO())
        return json.loads(out.getvalue())

    made = fq_json("enqueue", "lite:cli", '{"n": 1}')
    assert made["created"] == 1 and where(made["id"]) == ["lite"]
    made2 = fq_json("enqueue", "two:cli", '{"n": 2}')
    assert where(made2["id"]) == ["second"]
    assert fq_json("get", "two:cli", made2["id"])["payload"] == {"n": 2}
    names = {q["name"] for q in fq_json("queues")}
    assert {"lite:cli", "two:cli"} <= names
    (claimed,) = fq_json("claim", "lite:cli")
    assert fq_json("ack", "lite:cli", claimed["receipt"])["state"] == "succeeded"
    assert job_rows("lite", made["id"]) == [(made["id"], "succeeded")]


def test_rest_api_routes_by_queue_and_lists_every_database():
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("api", "api@example.com", "pw"))
    for q, alias in (("two:rest", "second"), ("lite:rest", "lite"), ("t.rest", "default")):
        r = client.post(f"/api/fq/queues/{q}/jobs/", {"payload": {"q": q}}, format="json")
        assert r.status_code == 201, r.json()
        uid = r.json()["id"]
        assert where(uid) == [alias]
        r = client.post(f"/api/fq/queues/{q}/claim/", {"count": 1}, format="json")
        assert r.status_code == 200 and r.json()[0]["id"] == uid
        r = client.post(f"/api/fq/queues/{q}/ack/", {"receipt": r.json()[0]["receipt"]}, format="json")
        assert r.status_code == 200, r.json()
        assert job_rows(alias, uid) == [(uid, "succeeded")]
        assert client.get(f"/api/fq/queues/{q}/jobs/{uid}/").json()["state"] == "succeeded"
    r = client.get("/api/fq/queues/")
    assert r.status_code == 200
    listed = json.dumps(r.json())
    assert all(q in listed for q in ("two:rest", "lite:rest", "t.rest"))


def test_admin_shows_each_database_in_turn():
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    on_second = fq.enqueue("two:adm", {"n": 1}).id
    on_default = fq.enqueue("t.adm", {"n": 1}).id
    r = client.get("/admin/django_fq/queue/")
    assert r.status_code == 200 and b"t.adm" in r.content and b"two:adm" not in r.content
    assert b"?fq_db=second" in r.content  # the switcher
    r = client.get("/admin/django_fq/queue/?fq_db=second")
    assert r.status_code == 200 and b"two:adm" in r.content and b"t.adm" not in r.content
    r = client.get("/admin/django_fq/job/")  # the session remembers the choice
    assert r.status_code == 200 and on_second.encode() in r.content and on_default.encode() not in r.content
    seq = Job.objects.using("second").get(uid=on_second).seq
    r = client.get(f"/admin/django_fq/job/{seq}/change/")
    assert r.status_code == 200 and on_second.encode() in r.content
    r = client.post(f"/admin/django_fq/job/{seq}/cancel/")
    assert r.status_code == 302
    assert job_rows("second", on_second) == [(on_second, "cancelled")]
    assert job_rows("default", on_default) == [(on_default, "queued")]
    r = client.post("/admin/django_fq/queue/add/", {**POLICY_FORM, "name": "two:adm2", "max_attempts": 3})
    assert r.status_code == 302, r.content.decode()[:2000]
    assert "two:adm2" in queue_rows("second") and fq.policy("two:adm2").max_attempts == 3
    r = client.get("/admin/django_fq/queue/?fq_db=nowhere")  # not an alias of the mapping: ignored
    assert r.status_code == 200 and b"two:adm" in r.content
    assert "Database &#x27;nowhere&#x27; of fq_db holds no queues (known: default, second, lite)" in r.content.decode()
    r = client.get("/admin/django_fq/job/?fq_db=%3Cscript%3E%00" + "x" * 5000)  # hostile: escaped, cut, never a 500
    assert r.status_code == 200 and "<script>" not in r.content.decode()
    r = client.get("/admin/django_fq/queue/?fq_db=default")
    assert b"t.adm" in r.content and b"two:adm" not in r.content


def test_a_bulk_run_stays_on_the_database_it_started_on(monkeypatch):
    from django_fq.admin import bulk

    monkeypatch.setattr(bulk, "BATCH", 1)
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    # Row numbers are per database: jobs 1 and 2 of each of "second" and "default".
    on_second = [fq.enqueue("two:bulk", {"n": n}).id for n in range(2)]
    on_default = [fq.enqueue("t.bulk", {"n": n}).id for n in range(2)]
    url = "/admin/django_fq/job/bulk/cancel/"
    assert client.get("/admin/django_fq/job/?fq_db=second").status_code == 200
    first = client.post(url, {"query": "", "db": "second"})
    assert first.status_code == 200 and first.context["done"] == 1
    # Another tab switches the session to "default"; the run's next step is not run there.
    assert client.get("/admin/django_fq/job/?fq_db=default").status_code == 200
    drifted = client.post(url, {"state": first.context["state"]})
    assert drifted.status_code == 400
    assert "this run was started on &#x27;second&#x27;" in drifted.content.decode()
    assert [job_rows("default", u)[0][1] for u in on_default] == ["queued", "queued"]
    # A start posted from a page of "second" after the switch is refused too.
    assert client.post(url, {"query": "", "db": "second"}).status_code == 400
    assert [job_rows("default", u)[0][1] for u in on_default] == ["queued", "queued"]
    # Back on "second", the run goes on where it stopped.
    again = client.post(f"{url}?fq_db=second", {"state": first.context["state"]})
    assert again.status_code == 200 and again.context["done"] == 2
    assert sorted(job_rows("second", u)[0][1] for u in on_second) == ["cancelled", "cancelled"]
    assert [job_rows("default", u)[0][1] for u in on_default] == ["queued", "queued"]


def test_a_job_pages_button_acts_on_the_database_the_page_showed():
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    jobs = {"second": fq.enqueue("two:btn", {"n": 1}).id, "default": fq.enqueue("t.btn", {"n": 1}).id}

    def seq_of(alias):
        return Job.objects.using(alias).get(uid=jobs[alias]).seq

    # The same row number on both (PostgreSQL's sequences are not rolled back between tests).
    for _ in range(2000):
        if seq_of("second") == seq_of("default"):
            break
        behind = min(("second", "default"), key=seq_of)
        jobs[behind] = fq.enqueue("two:btn" if behind == "second" else "t.btn", {"n": 1}).id
    on_second, on_default = jobs["second"], jobs["default"]
    seq = seq_of("second")
    assert seq_of("default") == seq
    assert client.get("/admin/django_fq/job/?fq_db=second").status_code == 200
    page = client.get(f"/admin/django_fq/job/{seq}/change/")
    button = re.search(r'formaction="([^"]*/cancel/[^"]*)"', page.content.decode()).group(1).replace("&amp;", "&")
    assert "fq_db=second" in button
    # Another tab switches the session to "default"; the button still cancels the job it showed.
    assert client.get("/admin/django_fq/job/?fq_db=default").status_code == 200
    assert client.post(button).status_code == 302
    assert job_rows("second", on_second) == [(on_second, "cancelled")]
    assert job_rows("default", on_default) == [(on_default, "queued")]


def test_live_updates_and_queue_controls_stay_on_the_database_the_page_showed():
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    fq.enqueue("two:live", {"n": 1})
    fq.enqueue("t.live", {"n": 1})
    assert client.get("/admin/django_fq/queue/dashboard/?fq_db=second").status_code == 200
    data = client.get("/admin/django_fq/queue/dashboard/live/").json()
    assert [q["name"] for q in data["queues"]] == ["two:live"] and data["all"]["ready"] == 1
    page = client.get("/admin/django_fq/queue/").content.decode()
    pause = re.search(r'action="([^"]*/pause-control/[^"]*)"', page).group(1).replace("&amp;", "&")
    limits = re.search(r'action="([^"]*/limits-control/[^"]*)"', page).group(1).replace("&amp;", "&")
    assert "fq_db=second" in pause and "fq_db=second" in limits
    # Another tab switches the session to "default"; the row's forms still act on the queue they showed.
    assert client.get("/admin/django_fq/queue/?fq_db=default").status_code == 200
    assert client.post(pause, {"op": "pause"}).status_code == 302
    assert client.post(limits, {"concurrency": "3"}).status_code == 302
    assert fq.stats("two:live").paused is True and fq.policy("two:live").concurrency == 3
    assert fq.stats("t.live").paused is False and fq.policy("t.live").concurrency == 0
    jobs = client.get("/admin/django_fq/job/?fq_db=second")
    assert "fq_db=second" in jobs.context["fq_live_url"]


def test_metrics_see_the_queues_of_every_database():
    for q in ("two:met", "lite:met", "t.met"):
        fq.enqueue(q, 1)
        fq.enqueue(q, 2)
    found = {}
    for family in QueueCollector().collect():
        for s in family.samples:
            if s.name == "fq_queue_jobs" and s.labels["state"] == "ready":
                found[s.labels["queue"]] = s.value
    assert found["two:met"] == found["lite:met"] == found["t.met"] == 2
    r = Client().get("/metrics/", HTTP_AUTHORIZATION="Bearer multi-dbs-metrics-token")
    assert r.status_code == 200
    text = r.content.decode()
    assert 'fq_queue_jobs{queue="lite:met",state="ready"} 2.0' in text
    assert 'fq_queue_jobs{queue="two:met",state="ready"} 2.0' in text


def test_export_then_import_restores_each_queue_on_its_database():
    ids = {q: fq.enqueue(q, {"q": q}, idempotency=f"k-{q}").id for q in ("two:bk", "lite:bk", "t.bk")}
    out = io.StringIO()
    summary = backup.export_jsonl(out)
    assert summary.queues >= 3 and summary.jobs >= 3
    text = out.getvalue()
    assert text.count('"format"') == 1  # one header for the three databases
    assert all(uid in text for uid in ids.values())
    partial = io.StringIO()
    backup.export_jsonl(partial, ["two:bk", "lite:bk"])
    assert ids["t.bk"] not in partial.getvalue() and ids["lite:bk"] in partial.getvalue()
    for q in ids:
        fq.delete_queue(q)
    assert all(where(uid) == [] for uid in ids.values())
    dry = backup.import_jsonl(io.StringIO(text), dry_run=True)
    assert dry.jobs_created == summary.jobs and all(where(uid) == [] for uid in ids.values())
    done = backup.import_jsonl(io.StringIO(text))
    assert done.jobs_created == summary.jobs and done.tokens_created == summary.tokens
    assert done.lines == len(text.splitlines())
    assert (
        where(ids["two:bk"]) == ["second"] and where(ids["lite:bk"]) == ["lite"] and where(ids["t.bk"]) == ["default"]
    )
    assert fq.enqueue("lite:bk", {}, idempotency="k-lite:bk").id == ids["lite:bk"]  # its token came back too


def test_checks_name_an_unknown_alias_and_a_pattern_that_never_matches(settings):
    settings.FQ_QUEUE_DATABASES = [("two:*", "second"), ("two:x*", "lite"), ("a:*", "nowhere"), ("bad q", "lite")]
    found = {(e.id, e.msg) for e in check_settings()}
    ids = [i for i, _ in found]
    assert ids.count("django_fq.E050") == 1 and ids.count("django_fq.W050") == 2
    assert any("'nowhere'" in m for i, m in found if i == "django_fq.E050")
    assert any("'two:x*'" in m and "'two:*'" in m for i, m in found if i == "django_fq.W050")
    settings.FQ_QUEUE_DATABASES = "second"
    assert [e.id for e in check_settings()] == ["django_fq.E050"]


@pytest.mark.django_db(transaction=True, databases=ALIASES)
def test_one_worker_process_serves_queues_on_three_databases():
    ids = {q: [fq.enqueue(q, {"n": i}).id for i in range(4)] for q in ("t.ok", "t2.ok", "lite:ok")}
    assert where(ids["t2.ok"][0]) == ["second"] and where(ids["lite:ok"][0]) == ["lite"]
    proc = WorkerProc(
        "--queue", "t.ok", "--queue", "t2.ok", "--queue", "lite:ok", "--burst", "--concurrency", "3",
        env={
            "DJANGO_SETTINGS_MODULE": "tests.settings_multi_dbs",
            "FQ_CHILD_SECOND_DB_NAME": str(connections["second"].settings_dict["NAME"]),
            "FQ_CHILD_LITE_DB_NAME": str(connections["lite"].settings_dict["NAME"]),
        },
    )  # fmt: skip
    assert proc.wait(timeout=180) == 0, proc.stderr
    alias = {"t.ok": "default", "t2.ok": "second", "lite:ok": "lite"}
    for q, uids in ids.items():
        for uid in uids:
            assert job_rows(alias[q], uid) == [(uid, "succeeded")], (q, proc.stderr)
    done = set(Done.objects.using("default").values_list("job_id", flat=True))
    assert done == {u for uids in ids.values() for u in uids}  # the handlers wrote the application's database
    start = next(line for line in proc.stderr.splitlines() if "worker.start" in line)
    listening = "listen" if connections["default"].vendor == "postgresql" else "poll"
    assert f"wakeup={listening},{listening},poll" in start, start  # one listener per alias


@pytest.mark.django_db(transaction=True, databases=ALIASES)
def test_a_database_whose_claims_fail_pauses_only_its_own_queues(monkeypatch, caplog):
    from django.db import OperationalError

    from django_fq.worker import Worker

    ids = [fq.enqueue("t2.ok", {"n": i}).id for i in range(3)]
    stuck = fq.enqueue("lite:ok", {"n": 9}).id
    real = fq.claim

    def claim(queue, **kwargs):
        if routing.alias_for(queue) == "lite":
            raise OperationalError("the lite database is down")  # what a lost server looks like to the loop
        return real(queue, **kwargs)

    monkeypatch.setattr(fq, "claim", claim)  # the claim loop calls services.claim
    ran = []
    worker = Worker(
        ["lite:ok", "t2.ok"], handlers={"lite:ok": ran.append, "t2.ok": ran.append}, burst=True, reaper=False
    )
    assert worker.aliases == ["second", "lite"]
    with caplog.at_level("ERROR", logger="django_fq.worker"):
        stats = worker.run()
    assert stats.ok == 3 and len(ran) == 3
    for uid in ids:
        assert job_rows("second", uid) == [(uid, "succeeded")]
    assert job_rows("lite", stuck) == [(stuck, "queued")]
    pauses = [r.getMessage() for r in caplog.records if "worker.db_error" in r.getMessage()]
    assert pauses and all("database=lite" in m for m in pauses)
    assert "retry_in_s=0.25" in pauses[0] and all("retry_in_s=0.25" not in m for m in pauses[1:])  # it grows


def worker_rows(alias: str) -> list[tuple]:
    """``(worker_id, queues)`` of the worker registry on ``alias``, read with plain SQL."""
    with connections[alias].cursor() as cur:
        cur.execute("SELECT worker_id, queues FROM django_fq_worker")
        return [tuple(r) for r in cur.fetchall()]


@pytest.mark.django_db(transaction=True, databases=ALIASES)
def test_a_worker_registers_on_each_database_it_serves_and_leaves_them_all():
    """The worker registry (docs/admin.md "Workers"): one row per alias, listing that alias's queues."""
    import signal

    from tests.worker.helpers import wait_until

    proc = WorkerProc(
        "--queue", "t.ok", "--queue", "t2.ok", "--queue", "lite:ok", "--concurrency", "2",
        env={
            "DJANGO_SETTINGS_MODULE": "tests.settings_multi_dbs",
            "FQ_CHILD_SECOND_DB_NAME": str(connections["second"].settings_dict["NAME"]),
            "FQ_CHILD_LITE_DB_NAME": str(connections["lite"].settings_dict["NAME"]),
            "FQ_CHILD_WORKER_HEARTBEAT_MS": "200",
        },
    )  # fmt: skip
    try:
        proc.wait_for(r"worker\.start", timeout=120)
        wid = re.search(r"worker=(\S+)", proc.wait_for(r"worker\.start")).group(1)
        assert {a: worker_rows(a) for a in ALIASES} == {
            "default": [(wid, "t.ok")], "second": [(wid, "t2.ok")], "lite": [(wid, "lite:ok")],
        }  # fmt: skip
        listed = fq.workers()
        assert sorted((w.database, w.queues, w.pid, w.state) for w in listed) == [
            ("default", ["t.ok"], proc.pid, "live"), ("lite", ["lite:ok"], proc.pid, "live"),
            ("second", ["t2.ok"], proc.pid, "live"),
        ]  # fmt: skip
        assert [w.database for w in fq.workers(queue="t2.ok")] == ["second"]
        # Every alias's row beats (one UPDATE per alias and interval).
        first = {w.database: w.heartbeat_at for w in listed}
        wait_until(lambda: all(w.heartbeat_at > first[w.database] for w in fq.workers()), what="a beat on every alias")
        proc.signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr
        assert all(worker_rows(a) == [] for a in ALIASES)
    finally:
        proc.kill()
