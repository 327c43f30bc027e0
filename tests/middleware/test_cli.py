"""``manage.py fq``: enqueue --metadata, jobs --tag, get shows metadata, release --delay-ms, refusals."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from django_fq import db
from django_fq import services as fq

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.cli.meta"


def run(*args, expect=0):
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("fq", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        code = exc.code
    assert code == expect, (code, out.getvalue(), err.getvalue())
    return out.getvalue(), err.getvalue()


def test_enqueue_metadata_get_and_tag_listing():
    out, _ = run("--json", "enqueue", Q, '{"n": 1}', "--metadata", '{"tenant": "acme", "tags": ["eu", "x"]}')
    job = json.loads(out)["id"]
    run("enqueue", Q, "2")
    got = json.loads(run("--json", "get", Q, job)[0])
    assert got["metadata"] == {"tenant": "acme", "tags": ["eu", "x"]} and got["tags"] == ["eu", "x"]
    assert "tags" in run("get", Q, job)[0]
    listed = json.loads(run("--json", "jobs", Q, "--tag", "eu")[0])
    assert [j["id"] for j in listed["jobs"]] == [job]
    assert "eu,x" in run("jobs", Q)[0]


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ("[1]", "metadata"),
        ("{bad", "metadata"),
        ('{"tags": ["a", "a"]}', "metadata.tags[1]"),
        (json.dumps({"k": "x" * 5000}), "metadata"),
    ],
)
def test_bad_metadata_exits_1_naming_the_field(metadata, field):
    _, err = run("--json", "enqueue", Q, "1", "--metadata", metadata, expect=1)
    assert json.loads(err)["field"] == field
    assert fq.queues() == []


def test_bad_tag_exits_1():
    fq.enqueue(Q, 1)
    _, err = run("--json", "jobs", Q, "--tag", "a b", expect=1)
    assert json.loads(err)["field"] == "tag"


def test_release_delay_ms(settings):
    fq.enqueue(Q, 1)
    job = fq.claim(Q)[0]
    before = db.db_now_ms()
    out, _ = run("--json", "release", Q, job.receipt, "--delay-ms", "5000")
    body = json.loads(out)
    assert body["state"] == "scheduled" and body["run_at"] >= before + 5000


def test_enqueue_refused_is_an_error_exit(settings):
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.refuse_forbidden"]
    _, err = run("--json", "enqueue", Q, "1", "--metadata", '{"tenant": "forbidden"}', expect=1)
    assert json.loads(err)["code"] == "enqueue_refused"
    assert fq.queues() == []
