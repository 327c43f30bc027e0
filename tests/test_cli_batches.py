"""``manage.py fq batch create|add|seal|show|list|cancel`` and ``fq enqueue --batch``, with --json and errors."""

from __future__ import annotations

import json

import pytest

from django_fq import services
from django_fq.models import Job

from .test_cli import fq

pytestmark = pytest.mark.django_db

Q = "cli:batch"
R = "cli:batch-reports"


def test_create_add_in_two_calls_seal_and_show():
    made = fq("batch", "create", Q, "--callback", '{"report": 1}', "--callback-queue", R,
              "--callback-options", '{"priority": 3}', "--json")  # fmt: skip
    assert made.code == 0, made.err
    bid = made.json["id"]
    assert (made.json["state"], made.json["total"]) == ("open", 0)
    added = fq("batch", "add", bid, "-", "--json", stdin='{"payload": 1}\n{"payload": 2}\n')
    assert added.code == 0, added.err
    assert all(r["created"] for r in added.json)
    one = fq("enqueue", Q, "3", "--batch", bid, "--json")
    assert one.code == 0, one.err
    shown = fq("batch", "show", bid, "--json").json
    assert (shown["total"], shown["done"]) == (3, 0)
    assert [m["id"] for m in shown["members"]] == [*(r["id"] for r in added.json), one.json["id"]]
    assert fq("batch", "seal", bid, "--json").json["state"] == "sealed"
    for job in services.claim(Q, count=3):
        services.ack(Q, job.receipt)
    shown = fq("batch", "show", bid, "--json").json
    assert (shown["state"], shown["succeeded"], shown["progress"]) == ("finished", 3, 1.0)
    callback = Job.objects.get(queue__name=R)
    assert shown["callback_job"] == callback.uid and callback.priority == 3
    assert json.loads(callback.metadata)["batch"]["succeeded"] == 3
    human = fq("batch", "show", bid).out
    assert "3/3 (100.0%)" in human and callback.uid in human
    listed = fq("batch", "list", Q, "--json").json
    assert [b["id"] for b in listed] == [bid]
    assert bid in fq("batch", "list").out


def test_cancel_and_errors_in_json_name_the_field():
    bid = fq("batch", "create", Q, "--json").json["id"]
    fq("batch", "add", bid, "-", "--json", stdin='[{"payload": 1}]')
    done = fq("batch", "cancel", bid, "--json").json
    assert (done["state"], done["cancelled"]) == ("cancelled", 1)
    run = fq("enqueue", Q, "1", "--batch", bid, "--json")
    assert (run.code, run.err_json["code"], run.err_json["field"]) == (1, "invalid_state", "batch")
    run = fq("enqueue", Q, "1", "--batch", "f" * 32, "--json")
    assert (run.err_json["code"], run.err_json["field"]) == ("batch_not_found", "batch")
    run = fq("batch", "show", "nope", "--json")
    assert (run.err_json["code"], run.err_json["field"]) == ("batch_not_found", "batch_id")
    run = fq("batch", "create", Q, "--callback", "1", "--callback-options", '{"unique_key": "k"}', "--json")
    assert (run.err_json["code"], run.err_json["field"]) == ("invalid", "callback.unique_key")
    run = fq("batch", "seal", "--json")
    assert run.code == 1 and run.err_json["field"] == "batch_id"
    human = fq("batch", "seal", "f" * 32)
    assert human.code == 1 and "no batch" in human.err
