"""Export/import carries batches: their state, counts and callback, and which jobs are their members."""

from __future__ import annotations

import json

import pytest

from django_fq import batches
from django_fq import services as fq
from django_fq.exceptions import InvalidBackup
from django_fq.models import Batch, Job

from .test_backup import export_text, lines_of, replace_line, restore, wipe

pytestmark = pytest.mark.django_db

Q = "bk:batch"
R = "bk:batch-reports"


def test_an_open_and_a_sealed_batch_round_trip_and_the_callback_fires_after_restore():
    fq.configure(R)
    sealed = batches.create(Q, callback={"queue": R, "payload": {"r": 1}, "priority": 4})
    members = [r.id for r in batches.add(sealed.id, [{"payload": i} for i in range(3)])]
    job = fq.claim(Q)[0]
    fq.ack(Q, job.receipt)
    batches.seal(sealed.id)
    open_one = batches.create(Q)
    text = export_text()
    kinds = [o["type"] for o in lines_of(text)[1:]]
    assert kinds.count("batch") == 2
    assert {o["id"]: o.get("batch") for o in lines_of(text) if o.get("type") == "job"} == dict.fromkeys(
        members, sealed.id
    )
    wipe()
    summary = restore(text)
    assert (summary.batches_created, summary.batches_skipped) == (2, 0)
    got = batches.get(sealed.id)
    assert (got.state, got.total, got.succeeded) == ("sealed", 3, 1)
    assert [m["id"] for m in batches.members(sealed.id)] == members
    assert batches.get(open_one.id).state == "open"
    for j in fq.claim(Q, count=2):
        fq.ack(Q, j.receipt)
    cb = Job.objects.get(queue__name=R)
    assert json.loads(cb.metadata)["batch"] == {"id": sealed.id, "total": 3, "succeeded": 3, "dead": 0, "cancelled": 0}
    assert cb.priority == 4 and cb.payload_value == {"r": 1}
    again = restore(text)
    assert (again.batches_created, again.batches_skipped) == (0, 2)
    assert Batch.objects.count() == 2


def test_a_sealed_batch_done_in_the_file_fires_at_import():
    b = batches.create(Q, callback=(R, "done"))
    batches.add(b.id, [{"payload": 1}])
    text = export_text()
    n, line = next((i, o) for i, o in enumerate(lines_of(text), 1) if o.get("type") == "batch")
    text = replace_line(text, n, {**line, "state": "sealed", "succeeded": 1})
    wipe()
    restore(text)
    assert batches.get(b.id).state == "finished"
    assert Job.objects.filter(queue__name=R).count() == 1


@pytest.mark.parametrize(
    "change, field",
    [
        ({"state": "half"}, "state"),
        ({"succeeded": 5}, "total"),
        ({"callback": {"payload": 1, "unique_key": "k"}}, "callback.unique_key"),
        ({"id": "x"}, "id"),
    ],
)
def test_bad_batch_lines_name_line_and_field(change, field):
    b = batches.create(Q, callback=(R, "r"))
    batches.add(b.id, [{"payload": 1}])
    text = export_text()
    n, line = next((i, o) for i, o in enumerate(lines_of(text), 1) if o.get("type") == "batch")
    wipe()
    with pytest.raises(InvalidBackup) as err:
        restore(replace_line(text, n, {**line, **change}))
    assert (err.value.extra.get("line"), err.value.field) == (n, field)
    assert not Batch.objects.exists() and not Job.objects.exists()


def test_a_job_naming_an_unknown_batch_is_refused():
    b = batches.create(Q)
    batches.add(b.id, [{"payload": 1}])
    text = export_text()
    n, line = next((i, o) for i, o in enumerate(lines_of(text), 1) if o.get("type") == "job")
    wipe()
    with pytest.raises(InvalidBackup) as err:
        restore(replace_line(text, n, {**line, "batch": "e" * 32}))
    assert (err.value.extra.get("line"), err.value.field) == (n, "batch")
    assert not Job.objects.exists()
