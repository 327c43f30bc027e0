"""Job metadata and tags through the Python API, and enqueue middleware (in-process, every database)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_fq import services as fq
from django_fq.exceptions import EnqueueRefused, InvalidArgument, InvalidJson, PayloadTooLarge
from django_fq.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.meta"


def test_metadata_round_trips_through_get_jobs_and_claim():
    meta = {"tenant": "acme", "trace": {"id": "abc"}, "tags": ["billing", "eu:west"]}
    job = fq.enqueue(Q, {"n": 1}, metadata=meta).id
    plain = fq.enqueue(Q, {"n": 2}).id
    info = fq.get(Q, job)
    assert info.metadata == meta and info.tags == ["billing", "eu:west"]
    assert fq.get(Q, plain).metadata == {} and fq.get(Q, plain).tags == []
    row = Job.objects.get(uid=job)
    assert row.tags == "|billing|eu:west|"
    claimed = {c.id: c for c in fq.claim(Q, count=10)}
    assert claimed[job].metadata == meta
    assert claimed[plain].metadata is None


def test_enqueue_many_items_carry_their_metadata_and_errors_name_the_item():
    results = fq.enqueue_many(Q, [{"payload": 1}, {"payload": 2, "metadata": {"tags": ["x"]}}])
    assert fq.get(Q, results[1].id).tags == ["x"]
    assert fq.get(Q, results[0].id).metadata == {}
    with pytest.raises(InvalidArgument) as info:
        fq.enqueue_many(Q, [{"payload": 1}, {"payload": 2}, {"payload": 3, "metadata": {"tags": ["ok", "bad tag"]}}])
    assert info.value.field == "items[2].metadata.tags[1]"
    assert Job.objects.count() == 2


@pytest.mark.parametrize(
    ("metadata", "field", "exc"),
    [
        ([1, 2], "metadata", InvalidArgument),
        ("text", "metadata", InvalidArgument),
        ({"tags": "a"}, "metadata.tags", InvalidArgument),
        ({"tags": [f"t{i}" for i in range(17)]}, "metadata.tags", InvalidArgument),
        ({"tags": ["a", "a"]}, "metadata.tags[1]", InvalidArgument),
        ({"tags": ["a", ""]}, "metadata.tags[1]", InvalidArgument),
        ({"tags": ["x" * 65]}, "metadata.tags[0]", InvalidArgument),
        ({"tags": ["a%b"]}, "metadata.tags[0]", InvalidArgument),
        ({"tags": [3]}, "metadata.tags[0]", InvalidArgument),
        ({"k": "nul\x00"}, "metadata", InvalidJson),
        ({"k": "\ud800"}, "metadata", InvalidJson),
        ({"k": float("nan")}, "metadata", InvalidJson),
        ({"k": object()}, "metadata", InvalidJson),
        ({"k": "x" * 5000}, "metadata", PayloadTooLarge),
    ],
)
def test_bad_metadata_is_refused_naming_the_field_and_writes_nothing(metadata, field, exc):
    with pytest.raises(exc) as info:
        fq.enqueue(Q, {}, metadata=metadata)
    assert info.value.field == field
    assert not Job.objects.exists()


def test_the_metadata_limit_follows_the_setting_up_to_the_hard_cap(settings):
    settings.FQ_MAX_METADATA_BYTES = 10_000
    fq.enqueue(Q, {}, metadata={"k": "x" * 9000})
    settings.FQ_MAX_METADATA_BYTES = 10**9  # capped at 64 KiB
    with pytest.raises(PayloadTooLarge, match="limit is 65536"):
        fq.enqueue(Q, {}, metadata={"k": "x" * 70000})


def test_a_duplicate_keeps_the_first_jobs_metadata():
    first = fq.enqueue(Q, {}, idempotency="tok", metadata={"v": 1})
    again = fq.enqueue(Q, {}, idempotency="tok", metadata={"v": 2})
    assert again.id == first.id and not again.created
    assert fq.get(Q, first.id).metadata == {"v": 1}
    keyed = fq.enqueue(Q, {}, unique_key="k", metadata={"v": 3})
    assert fq.enqueue(Q, {}, unique_key="k", metadata={"v": 4}).id == keyed.id
    assert fq.get(Q, keyed.id).metadata == {"v": 3}


def test_tag_filter_pages_with_the_cursor_and_is_exact():
    wanted = []
    for i in range(7):
        tags = ["even"] if i % 2 == 0 else ["odd"]
        tags.append(f"n{i}")
        job = fq.enqueue(Q, {"i": i}, metadata={"tags": tags}).id
        if i % 2 == 0:
            wanted.append(job)
    fq.enqueue(Q, {}, metadata={"tags": ["EVEN", "even_", "xeven"]})  # neither case nor a longer tag matches
    fq.enqueue(Q, {})
    seen, cursor = [], None
    while True:
        page = fq.jobs(Q, tag="even", count=2, cursor=cursor)
        assert len(page.jobs) <= 2
        seen += [j.id for j in page.jobs]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(seen) == sorted(wanted) and len(seen) == 4
    assert [j.id for j in fq.jobs(Q, state="ready", tag="n3").jobs] == [j.id for j in fq.jobs(Q).jobs if "n3" in j.tags]
    assert fq.jobs(Q, tag="e_en").jobs == []  # "_" is not a wildcard
    with pytest.raises(InvalidArgument) as info:
        fq.jobs(Q, tag="bad tag")
    assert info.value.field == "tag"


def test_enqueue_middleware_adds_metadata_and_refuses(settings):
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.add_tenant", "tests.middleware.mw.refuse_forbidden"]
    given = {"tags": ["mine"]}
    job = fq.enqueue(Q, {"n": 1}, metadata=given).id
    assert fq.get(Q, job).metadata == {"tags": ["mine", "stamped"], "tenant": "acme"}
    assert given == {"tags": ["mine"]}  # the caller's dict is not changed
    many = fq.enqueue_many(Q, [{"payload": 1}, {"payload": 2, "metadata": {"tenant": "t2"}}])
    assert [fq.get(Q, r.id).metadata["tenant"] for r in many] == ["acme", "t2"]
    assert fq.jobs(Q, tag="stamped").jobs and len(fq.jobs(Q, tag="stamped").jobs) == 3
    before = Job.objects.count()
    with pytest.raises(EnqueueRefused) as info:
        fq.enqueue(Q, {}, metadata={"tenant": "forbidden"})
    assert info.value.code == "enqueue_refused" and info.value.status == 403
    with pytest.raises(EnqueueRefused) as info:
        fq.enqueue_many(Q, [{"payload": 1}, {"payload": 2, "metadata": {"tenant": "forbidden"}}])
    assert info.value.field == "items[1]"
    with pytest.raises(EnqueueRefused):
        fq.enqueue("t.meta.closed", {})
    assert Job.objects.count() == before


def test_enqueue_middleware_that_breaks_the_chain_is_a_configuration_error(settings):
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.forgets_to_return"]
    with pytest.raises(ImproperlyConfigured, match="call_next"):
        fq.enqueue(Q, {})
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.nothing_here"]
    with pytest.raises(ImproperlyConfigured, match=r"FQ_ENQUEUE_MIDDLEWARE\[0\]"):
        fq.enqueue(Q, {})
    settings.FQ_ENQUEUE_MIDDLEWARE = []
    assert fq.enqueue(Q, {}).created
    assert Job.objects.count() == 1


def test_enqueue_middleware_output_is_validated(settings):
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.add_tenant"]
    with pytest.raises(InvalidArgument) as info:
        fq.enqueue(Q, {}, metadata={"tags": [f"t{i}" for i in range(16)]})  # the middleware adds a 17th
    assert info.value.field == "metadata.tags"
