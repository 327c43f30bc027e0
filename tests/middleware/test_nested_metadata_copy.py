"""Enqueue middleware gets a copy of the caller's metadata down to its nested lists and objects.

A middleware that changes a nested value in place (``request.metadata["tags"].append``)
must change neither the caller's metadata nor the next item of an ``enqueue_many``
that shares the same metadata object (django_fq.middleware.run_enqueue_middleware).
"""

from __future__ import annotations

import pytest

from django_fq import services as fq

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.meta.copy"


def append_in_place(request, call_next):
    """A middleware that changes nested values in place instead of replacing them."""
    request.metadata.setdefault("tags", []).append("mw")
    request.metadata.setdefault("trace", {}).setdefault("hops", []).append(request.queue)
    return call_next(request)


@pytest.fixture(autouse=True)
def _middleware(settings):
    settings.FQ_ENQUEUE_MIDDLEWARE = [f"{__name__}.append_in_place"]


def test_the_callers_nested_metadata_is_not_changed():
    meta = {"tags": ["a"], "trace": {"hops": []}}
    job = fq.enqueue(Q, 1, metadata=meta).id
    assert meta == {"tags": ["a"], "trace": {"hops": []}}
    info = fq.get(Q, job)
    assert info.tags == ["a", "mw"] and info.metadata["trace"] == {"hops": [Q]}


def test_enqueue_many_items_sharing_one_metadata_object_each_get_the_middlewares_change_once():
    meta = {"tags": ["a"], "trace": {"hops": []}}
    results = fq.enqueue_many(Q, [{"payload": n, "metadata": meta} for n in range(3)])
    assert meta == {"tags": ["a"], "trace": {"hops": []}}
    for result in results:
        info = fq.get(Q, result.id)
        assert info.tags == ["a", "mw"] and info.metadata["trace"] == {"hops": [Q]}
