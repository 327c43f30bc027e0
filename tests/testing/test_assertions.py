"""``assert_enqueued`` / ``assert_not_enqueued`` / ``enqueued_jobs``: read from the database, with messages that show the queue."""

from __future__ import annotations

from unittest.mock import ANY

import pytest
from django.db import transaction

from django_fq import services as fq
from django_fq.models import Job
from django_fq.testing import assert_enqueued, assert_not_enqueued, drain, enqueued_jobs

from .handlers import NOHANDLER, OK

pytestmark = pytest.mark.django_db

Q = NOHANDLER  # nothing runs these jobs: they stay waiting


def test_a_matching_job_is_found_and_returned():
    job = fq.enqueue(Q, {"to": "a@example.com", "n": 1}, priority=5).id

    [found] = assert_enqueued(Q, {"to": "a@example.com", "n": 1})

    assert found.id == job and found.state == "ready" and found.priority == 5
    assert assert_enqueued(Q, {"to": ANY, "n": 1}, priority=5) == [found]
    assert assert_enqueued(Q) == [found]  # no payload given: any job
    assert_not_enqueued(Q, {"to": "b@example.com", "n": 1})


def test_a_missing_payload_fails_with_what_the_queue_holds():
    job = fq.enqueue(Q, {"to": "a@example.com"}).id

    with pytest.raises(AssertionError) as caught:
        assert_enqueued(Q, {"to": "b@example.com"})

    message = str(caught.value)
    assert message.startswith(
        'no job with payload={"to":"b@example.com"} in tt.nohandler (scheduled/ready) holds 1 job(s):'
    )
    assert f'{job} [ready] payload={{"to":"a@example.com"}}' in message


def test_an_empty_or_missing_queue_says_so():
    with pytest.raises(AssertionError, match=r"^no job in tt.never \(scheduled/ready\) holds no job"):
        assert_enqueued("tt.never")
    assert enqueued_jobs("tt.never") == []
    assert_not_enqueued("tt.never")


def test_count_is_exact():
    for _ in range(2):
        fq.enqueue(Q, {"kind": "welcome"})
    fq.enqueue(Q, {"kind": "other"})

    assert len(assert_enqueued(Q, {"kind": "welcome"}, count=2)) == 2
    assert_enqueued(Q, {"kind": "nope"}, count=0)
    with pytest.raises(
        AssertionError, match=r'expected 3 job\(s\) with payload=\{"kind":"welcome"\}, found 2 in tt.nohandler'
    ):
        assert_enqueued(Q, {"kind": "welcome"}, count=3)


def test_assert_not_enqueued_lists_the_jobs_that_match():
    job = fq.enqueue(Q, {"kind": "spam"}).id

    with pytest.raises(AssertionError) as caught:
        assert_not_enqueued(Q, {"kind": "spam"})

    assert str(caught.value).startswith(
        'expected no job with payload={"kind":"spam"}, but tt.nohandler (scheduled/ready) holds 1 job(s):'
    )
    assert job in str(caught.value)
    with pytest.raises(AssertionError, match=r"^expected no job, but tt.nohandler \(scheduled/ready\) holds 1 job"):
        assert_not_enqueued(Q)


def test_metadata_matches_the_items_given_and_none_means_no_metadata():
    plain = fq.enqueue(Q, {"n": 1}).id
    tagged = fq.enqueue(Q, {"n": 2}).id
    Job.objects.filter(uid=tagged).update(metadata='{"tenant": "acme", "trace": "t-1"}')

    [found] = assert_enqueued(Q, metadata={"tenant": "acme"})  # other keys (middleware's) may be there
    assert found.id == tagged and found.metadata == {"tenant": "acme", "trace": "t-1"}
    assert [j.id for j in assert_enqueued(Q, metadata=None)] == [plain]
    assert_not_enqueued(Q, metadata={"tenant": "other"})
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(Q, {"n": 2}, metadata={"tenant": "other"})
    assert 'metadata={"tenant":"acme","trace":"t-1"}' in str(caught.value)


def test_state_chooses_which_jobs_count_and_the_default_is_waiting():
    delayed = fq.enqueue(OK, {"n": 1}, delay_ms=3_600_000).id
    done = fq.enqueue(OK, {"n": 2}).id
    drain(OK)

    assert [j.id for j in enqueued_jobs(OK)] == [delayed]
    assert [j.state for j in enqueued_jobs(OK)] == ["scheduled"]
    assert_not_enqueued(OK, {"n": 2})
    [found] = assert_enqueued(OK, {"n": 2}, state="succeeded")
    assert found.id == done
    assert [j.id for j in enqueued_jobs(OK, state=None)] == [delayed, done]  # enqueue order
    with pytest.raises(ValueError, match="state must be one of"):
        enqueued_jobs(OK, state="finished")
    with pytest.raises(TypeError, match="unknown option 'colour'"):
        assert_enqueued(OK, colour="red")


def test_the_assertions_see_the_tests_own_uncommitted_transaction():
    with transaction.atomic():
        job = fq.enqueue(Q, {"inside": True}).id
        assert [j.id for j in assert_enqueued(Q, {"inside": True})] == [job]
    assert_enqueued(Q, {"inside": True})


def test_the_fixture_bundles_the_assertions(fq_assert_enqueued):
    fq.enqueue(Q, {"n": 9})
    assert len(fq_assert_enqueued(Q, {"n": 9})) == 1
    fq_assert_enqueued.assert_not_enqueued(Q, {"n": 8})
    assert [j.payload for j in fq_assert_enqueued.enqueued_jobs(Q)] == [{"n": 9}]
