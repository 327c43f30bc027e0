"""Dependencies between jobs (docs/reference/semantics.md §9 "Dependencies"): waiting, release, failure policies."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidDependency

from .helpers import QUEUE, claim_one

pytestmark = pytest.mark.django_db

OTHER = "tests:svc-b"


def state(job_id: str, queue: str = QUEUE) -> str:
    return fq.get(queue, job_id).state


def run_one(queue: str = QUEUE, *, result=None):
    """Claim the one ready job of ``queue`` and ack it; return its id."""
    job = claim_one(queue)
    fq.ack(queue, job.receipt, result=result)
    return job.id


def test_chain_runs_in_order(q):
    a = fq.enqueue(q, {"step": "a"}).id
    b = fq.enqueue(q, {"step": "b"}, depends_on=[a]).id
    c = fq.enqueue(q, {"step": "c"}, depends_on=[b]).id
    assert (state(a), state(b), state(c)) == ("ready", "waiting", "waiting")
    assert fq.stats(q).counts["waiting"] == 2
    assert run_one() == a
    assert state(b) == "ready" and state(c) == "waiting"
    assert run_one() == b
    assert run_one() == c
    assert fq.claim(q) == []


def test_diamond_releases_the_join_once(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[a]).id
    c = fq.enqueue(q, "c", depends_on=[a]).id
    d = fq.enqueue(q, "d", depends_on=[b, c]).id
    run_one()
    assert {state(b), state(c), state(d)} == {"ready", "waiting"}
    run_one()
    assert state(d) == "waiting"
    run_one()
    assert state(d) == "ready"
    assert run_one() == d


def test_dependency_in_another_queue_and_already_succeeded(q):
    fq.configure(OTHER)
    a = fq.enqueue(OTHER, "a").id
    run_one(OTHER)
    b = fq.enqueue(q, "b", depends_on=[a]).id
    assert state(b) == "ready"
    info = fq.get(q, b)
    assert info.depends_on == [{"id": a, "queue": OTHER, "state": "succeeded", "on_failure": "cancel", "pending": False}]
    assert fq.get(OTHER, a).dependents[0]["id"] == b


@pytest.mark.parametrize(
    "value, field",
    [
        ("abc", "depends_on"),
        (["nope"], "depends_on[0]"),
        (["0" * 32], "depends_on[0]"),
        ([{"id": "0" * 32, "on_failure": "maybe"}], "depends_on[0].on_failure"),
        ([{"id": "0" * 32, "extra": 1}], "depends_on[0].extra"),
        (["0" * 32] * 1001, "depends_on"),
    ],
)
def test_bad_dependencies_name_the_field_and_write_nothing(q, value, field):
    before = fq.stats(q).totals["enqueued"]
    with pytest.raises(InvalidDependency) as err:
        fq.enqueue(q, "x", depends_on=value)
    assert err.value.field == field
    assert fq.stats(q).totals["enqueued"] == before


def kill(queue: str = QUEUE) -> str:
    """Claim the one ready job of ``queue`` and make it dead; return its id."""
    job = claim_one(queue)
    fq.nack(queue, job.receipt, error="boom", permanent=True)
    return job.id


def test_cancel_policy_cascades_to_dependents_of_dependents(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[a]).id
    c = fq.enqueue(q, "c", depends_on=[b]).id
    kill()
    assert (state(a), state(b), state(c)) == ("dead", "cancelled", "cancelled")
    assert fq.get(q, b).last_error == f"cancelled: dependency {a} is dead"
    assert fq.get(q, c).last_error == f"cancelled: dependency {b} is cancelled"
    counts = fq.stats(q).counts
    assert (counts["waiting"], counts["cancelled"], counts["dead"]) == (0, 2, 1)
    # retry of the dead one runs it again; "cancel" dependents stay cancelled
    fq.retry(q, a)
    run_one()
    assert (state(b), state(c)) == ("cancelled", "cancelled")


def test_run_policy_counts_a_failed_dependency_as_satisfied(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b").id
    report = fq.enqueue(q, "report", depends_on=[{"id": a, "on_failure": "run"}, {"id": b, "on_failure": "run"}]).id
    kill()
    assert state(report) == "waiting"
    fq.cancel(q, b)
    assert state(report) == "ready"
    # a later retry and success of the dead one does not count it twice
    assert run_one() == report
    fq.retry(q, a)
    run_one()
    assert state(report) == "succeeded"


def test_wait_policy_waits_for_a_retry_of_the_dead_one(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[{"id": a, "on_failure": "wait"}]).id
    kill()
    assert state(b) == "waiting"
    fq.retry(q, a)  # redrive resumes the workflow
    assert run_one() == a
    assert state(b) == "ready"


def test_wait_policy_on_a_cancelled_dependency_cancels(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[{"id": a, "on_failure": "wait"}]).id
    kill()
    fq.cancel(q, a)  # a cancelled job can never be retried: waiting for it would be forever
    assert state(b) == "cancelled"


def test_dependency_already_failed_at_enqueue(q):
    a = fq.enqueue(q, "a").id
    kill()
    runs = fq.enqueue(q, "r", depends_on=[{"id": a, "on_failure": "run"}]).id
    waits = fq.enqueue(q, "w", depends_on=[{"id": a, "on_failure": "wait"}]).id
    cancels = fq.enqueue(q, "c", depends_on=[a]).id
    assert (state(runs), state(waits), state(cancels)) == ("ready", "waiting", "cancelled")
    assert fq.stats(q).totals["cancelled"] == 1


def test_cancel_of_a_waiting_job_cascades(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[a]).id
    c = fq.enqueue(q, "c", depends_on=[b]).id
    fq.cancel(q, b)
    assert (state(a), state(b), state(c)) == ("ready", "cancelled", "cancelled")
    run_one()
    assert fq.claim(q) == []


def test_expiry_on_the_last_attempt_cancels_dependents(q, clock):
    fq.configure(q, max_attempts=1)
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[a]).id
    claim_one(q, visibility_ms=1)
    clock.advance(10)
    fq.reap()
    assert (state(a), state(b)) == ("dead", "cancelled")


def test_released_job_keeps_its_delay_priority_and_unique_key(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[a], delay_ms=3_600_000, unique_key="k", priority=5).id
    # a waiting job holds its unique key
    assert fq.enqueue(q, "again", unique_key="k").id == b
    run_one()
    info = fq.get(q, b)
    assert info.state == "scheduled" and info.priority == 5


def test_ack_many_releases(q):
    ups = [fq.enqueue(q, i).id for i in range(3)]
    down = fq.enqueue(q, "down", depends_on=ups).id
    jobs = fq.claim(q, count=3)
    out = fq.ack_many(q, [(j.receipt, None) for j in jobs])
    assert all(r.state == "succeeded" for r in out)
    assert state(down) == "ready"


def test_enqueue_many_items_and_bad_item_field(q):
    a = fq.enqueue(q, "a").id
    res = fq.enqueue_many(q, [{"payload": 1}, {"payload": 2, "depends_on": [a]}])
    assert state(res[1].id) == "waiting" and state(res[0].id) == "ready"
    with pytest.raises(InvalidDependency) as err:
        fq.enqueue_many(q, [{"payload": 1}, {"payload": 2, "depends_on": ["f" * 32]}])
    assert err.value.field == "items[1].depends_on[0]"


def test_jobs_listing_by_waiting_state(q):
    a = fq.enqueue(q, "a").id
    b = fq.enqueue(q, "b", depends_on=[a]).id
    page = fq.jobs(q, state="waiting")
    assert [j.id for j in page.jobs] == [b]


def test_prune_keeps_a_finished_job_an_unfinished_one_needs(q):
    a = fq.enqueue(q, "a").id
    fq.enqueue(q, "b", depends_on=[a])
    fq.enqueue(q, "c")
    run_one()  # a
    assert fq.prune(retention_ms=0).jobs == 0  # b (ready) still needs a
    assert state(a) == "succeeded"
    run_one()  # b
    run_one()  # c
    assert fq.prune(retention_ms=0).jobs == 3
    from django_fq.models import Dependency

    assert not Dependency.objects.exists()


def test_delete_queue_cancels_dependents_in_other_queues(q):
    fq.configure(OTHER)
    a = fq.enqueue(OTHER, "a").id
    b = fq.enqueue(q, "b", depends_on=[a]).id
    r = fq.enqueue(q, "r", depends_on=[{"id": a, "on_failure": "run"}]).id
    fq.delete_queue(OTHER)
    assert (state(b), state(r)) == ("cancelled", "ready")
    from django_fq.models import Dependency

    assert not Dependency.objects.exists()


def test_fan_out_to_1000_then_fan_in(q):
    root = fq.enqueue(q, "root").id
    middle = [r.id for r in fq.enqueue_many(q, [{"payload": i, "depends_on": [root]} for i in range(1000)])]
    join = fq.enqueue(q, "join", depends_on=middle).id
    assert fq.stats(q).counts["waiting"] == 1001
    assert run_one() == root
    assert fq.stats(q).counts["ready"] == 1000
    done = 0
    while done < 1000:
        batch = fq.claim(q, count=100)
        assert batch and join not in {j.id for j in batch}
        fq.ack_many(q, [(j.receipt, None) for j in batch])
        done += len(batch)
        assert state(join) == ("ready" if done == 1000 else "waiting")
    assert run_one() == join
    counts = fq.stats(q).counts
    assert counts["succeeded"] == 1002 and counts["waiting"] == 0


def test_export_import_round_trip_keeps_dependencies_and_waiting_jobs(q):
    import io

    from django_fq import backup
    from django_fq.models import Dependency, Job, Queue

    fq.configure(OTHER)
    a = fq.enqueue(OTHER, "a").id
    done = fq.enqueue(q, "done").id
    run_one(q)
    b = fq.enqueue(q, "b", depends_on=[a, {"id": done, "on_failure": "run"}]).id
    c = fq.enqueue(q, "c", depends_on=[{"id": b, "on_failure": "wait"}]).id
    out = io.StringIO()
    backup.export_jsonl(out)
    text = out.getvalue()
    Dependency.objects.all().delete()
    Job.objects.all().delete()
    Queue.objects.all().delete()
    summary = backup.import_jsonl(text.splitlines())
    assert summary.jobs_created == 4
    assert (state(b), state(c)) == ("waiting", "waiting")
    assert sorted(fq.get(q, b).depends_on, key=lambda e: e["id"]) == sorted(
        [
            {"id": a, "queue": OTHER, "state": "ready", "on_failure": "cancel", "pending": True},
            {"id": done, "queue": q, "state": "succeeded", "on_failure": "run", "pending": False},
        ],
        key=lambda e: e["id"],
    )
    assert fq.stats(q).counts["waiting"] == 2
    run_one(OTHER)
    assert state(b) == "ready"
    assert run_one(q) == b
    assert run_one(q) == c


def test_import_refuses_an_unknown_dependency(q):
    import json

    from django_fq import backup
    from django_fq.exceptions import InvalidBackup

    job = {
        "type": "job", "queue": "tests:imp", "id": "a" * 32, "state": "waiting", "priority": 0,
        "run_at": 1, "enqueued_at": 1, "attempts": 0, "max_attempts": 3, "payload": 1,
        "depends_on": [{"id": "b" * 32, "on_failure": "cancel", "pending": True}],
    }  # fmt: skip
    lines = [
        json.dumps({"format": "django-fq", "version": 1}),
        json.dumps({"type": "queue", "name": "tests:imp"}),
        json.dumps(job),
    ]
    with pytest.raises(InvalidBackup) as err:
        backup.import_jsonl(lines)
    assert (err.value.extra.get("line"), err.value.field) == (3, "depends_on[0]")
    from django_fq.models import Queue

    assert not Queue.objects.filter(name="tests:imp").exists()


def test_claim_says_which_jobs_have_dependents_and_the_hinted_ack_releases_them(q):
    # docs/reference/python-api.md, ack_many: has_dependents is a hint, never a change of outcome.
    a = fq.enqueue(q, "a").id
    plain = fq.enqueue(q, "plain").id
    b = fq.enqueue(q, "b", depends_on=[a], delay_ms=0).id
    c = fq.enqueue(q, "c", depends_on=[a, plain]).id
    jobs = {j.id: j for j in fq.claim(q, count=10)}
    assert set(jobs) == {a, plain}
    assert jobs[a].has_dependents and jobs[plain].has_dependents
    # Hinted right (a), and hinted for a job that is not there at all: both acked, b released once.
    results = fq.ack_many(q, [(jobs[a].receipt, {"r": 1})], has_dependents=[a, "0" * 32])
    assert [r.state for r in results] == ["succeeded"]
    assert state(b) == "ready" and state(c) == "waiting"
    assert fq.stats(q).counts["waiting"] == 1
    # Not hinted although it has dependents: the one-statement ack leaves it, the fallback releases c.
    assert [r.state for r in fq.ack_many(q, [(jobs[plain].receipt, None)])] == ["succeeded"]
    assert state(c) == "ready"
    got = {j.id: j for j in fq.claim(q, count=10)}
    assert set(got) == {b, c} and not any(j.has_dependents for j in got.values())
    # A replay of the hinted ack stays a replay.
    again = fq.ack_many(q, [(jobs[a].receipt, {"r": 1})], has_dependents=[a])
    assert again[0].replay and fq.get(q, a).result == {"r": 1}


def test_released_dependent_of_a_hinted_batch_is_claimable_at_once(q):
    # The release lowers the claim floor and wakes the queue in the ack's transaction.
    roots = [fq.enqueue(q, {"i": i}).id for i in range(3)]
    joins = [fq.enqueue(q, {"join": i}, depends_on=roots).id for i in range(2)]
    jobs = fq.claim(q, count=3)
    assert sorted(j.id for j in jobs) == sorted(roots)
    fq.ack_many(q, [(j.receipt, None) for j in jobs[:2]], has_dependents=[j.id for j in jobs])
    assert {state(j) for j in joins} == {"waiting"}
    assert fq.claim(q, count=3) == []
    fq.ack_many(q, [(jobs[2].receipt, None)], has_dependents=[jobs[2].id])
    assert sorted(j.id for j in fq.claim(q, count=3)) == sorted(joins)
    assert fq.stats(q).counts["waiting"] == 0
