"""C15 — Payload limits are exact and loud.

Size is the byte length of the compact UTF-8 JSON encoding. A payload of
exactly the limit is stored and comes back identical; one byte more is
refused with "payload too large"; values no database can store alike (NUL,
lone surrogates, NaN, Infinity) are refused with an invalid-JSON error. A
refusal stores nothing, not even a new queue.
"""

from __future__ import annotations

import json

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidJson, PayloadTooLarge, QueueNotFound

pytestmark = pytest.mark.django_db

SMALL_LIMIT = 4096
MIB = 1024 * 1024


def _encode(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def payload_of_size(size: int) -> dict:
    """A varied JSON document whose compact UTF-8 encoding is exactly ``size`` bytes."""
    doc = {
        "text": "é€😀 ünïcødé \"quoted\" \\ / \n\t",
        "numbers": [0, -1, 2**53, -(2**63), 1.5, -0.25, 1e-7],
        "flags": [True, False, None],
        "nested": {"list": [[], {}, [{"k": "v"}]], "empty": ""},
        "pad": "",
    }
    doc["pad"] = "x" * (size - len(_encode(doc)))
    assert len(_encode(doc)) == size
    return doc


def _totals(queue: str):
    stats = fq.stats(queue)
    return stats.counts, stats.totals


@pytest.mark.parametrize("limit", [SMALL_LIMIT, None], ids=["4096", "default-1MiB"])
def test_c15_payload_of_exactly_the_limit_round_trips(settings, limit):
    if limit is None:
        assert not hasattr(settings, "FQ_MAX_PAYLOAD_BYTES")  # the default applies
        limit = MIB
    else:
        settings.FQ_MAX_PAYLOAD_BYTES = limit
    queue = "c15-exact"
    payload = payload_of_size(limit)
    job = fq.enqueue(queue, payload).id

    stored = fq.get(queue, job).payload
    assert stored == payload
    assert _encode(stored) == _encode(payload)  # same keys, same order, same values
    [claimed] = fq.claim(queue, visibility_ms=60_000)
    assert claimed.id == job and claimed.payload == payload
    assert _encode(claimed.payload) == _encode(payload)

    # One byte more is refused, loudly, and stores nothing.
    before = _totals(queue)
    too_big = payload_of_size(limit + 1)
    with pytest.raises(PayloadTooLarge) as caught:
        fq.enqueue(queue, too_big)
    err = caught.value
    assert (err.field, err.code, err.status) == ("payload", "payload_too_large", 413)
    assert "payload" in err.message and str(limit) in err.message and str(limit + 1) in err.message
    assert err.as_dict()["limit"] == limit and err.as_dict()["size"] == limit + 1
    with pytest.raises(PayloadTooLarge) as caught:
        fq.enqueue_many(queue, [{"payload": 1}, {"payload": too_big}])
    assert caught.value.field == "items[1].payload"
    assert _totals(queue) == before
    with pytest.raises(PayloadTooLarge):
        fq.enqueue("c15-new-queue", too_big)
    with pytest.raises(QueueNotFound):
        fq.policy("c15-new-queue")


def test_c15_result_has_the_same_cap(settings):
    settings.FQ_MAX_PAYLOAD_BYTES = SMALL_LIMIT
    queue = "c15-result"
    fq.enqueue(queue, {"n": 1})
    [claimed] = fq.claim(queue, visibility_ms=60_000)
    with pytest.raises(PayloadTooLarge) as caught:
        fq.ack(queue, claimed.receipt, result=payload_of_size(SMALL_LIMIT + 1))
    assert caught.value.field == "result"
    assert fq.get(queue, claimed.id).state == "running"  # the refused ack changed nothing
    result = payload_of_size(SMALL_LIMIT)
    assert fq.ack(queue, claimed.receipt, result=result).state == "succeeded"
    assert _encode(fq.get(queue, claimed.id).result) == _encode(result)


UNSTORABLE = {
    "nul-in-string": {"text": "a\x00b"},
    "nul-in-key": {"k\x00": 1},
    "nul-deep": {"a": [1, {"b": ["ok", "\x00"]}]},
    "nul-alone": "\x00",
    "lone-high-surrogate": {"text": "\ud800"},
    "lone-low-surrogate-in-key": {"\udfff": 1},
    "nan": {"x": float("nan")},
    "infinity": {"x": float("inf")},
    "minus-infinity": [float("-inf")],
}


@pytest.mark.parametrize("payload", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
def test_c15_unstorable_values_are_refused_and_nothing_is_stored(payload):
    queue = "c15-bad"
    fq.enqueue(queue, {"ok": True})
    before = _totals(queue)
    with pytest.raises(InvalidJson) as caught:
        fq.enqueue(queue, payload)
    err = caught.value
    assert (err.field, err.code, err.status) == ("payload", "invalid_json", 400)
    assert "payload" in err.message
    with pytest.raises(InvalidJson) as caught:
        fq.enqueue_many(queue, [{"payload": 1}, {"payload": payload}])
    assert caught.value.field == "items[1].payload"
    assert _totals(queue) == before
    with pytest.raises(InvalidJson):
        fq.enqueue("c15-bad-new", payload)
    with pytest.raises(QueueNotFound):
        fq.policy("c15-bad-new")
