"""Bulk enqueue of a large batch: every rule of ``enqueue_many`` holds (docs/reference/semantics.md#s9-idempotency).

On PostgreSQL a plain batch of ``COPY_MIN_ROWS`` items or more streams its rows
with ``COPY … FROM STDIN`` after one head statement (docs/performance.md#bulk-enqueue-copy);
the other databases take their own path. The rules are checked on every
database with batches above that size; the tests marked ``postgres_only`` look
at the COPY mechanics themselves (a failure in the middle of the stream, what
travels, the escaping of COPY's text format).
"""

from __future__ import annotations

import importlib

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from django_fq import db, storage, validation
from django_fq import services as fq
from django_fq.exceptions import InvalidJson, PayloadTooLarge, QueueFull
from django_fq.models import Job, Queue
from django_fq.services import _base
from django_fq.storage import postgres
from tests.listening import listening

from .helpers import QUEUE, rows

enqueue_module = importlib.import_module("django_fq.services.enqueue")

pytestmark = pytest.mark.django_db(transaction=True)

#: A batch size that takes the COPY path on PostgreSQL (and the general one elsewhere).
N = postgres.COPY_MIN_ROWS + 50


def _counters(queue: str) -> dict[str, int]:
    qid = Queue.objects.get(name=queue).id
    return _base.counter_sums(connection, qid, ("enqueued", "active", "deduplicated"))


def _stored(queue: str) -> list[tuple]:
    """The job rows of ``queue`` in claim (seq) order: what an enqueue writes, without ids or times."""
    return list(
        Job.objects.filter(queue__name=queue)
        .order_by("seq")
        .values_list(
            "state", "priority", "attempts", "max_attempts", "generation", "timeout_ms", "payload", "payload_size",
            "last_error", "errors", "unique_key", "idempotency", "worker", "metadata", "tags", "progress_message",
            "claimed_at", "finished_at", "result",
        )
    )  # fmt: skip


# --- what is written -----------------------------------------------------------------------------


def test_a_large_batch_keeps_the_input_order_the_database_clock_and_its_counters():
    fq.configure(QUEUE)
    before = db.db_now_ms()
    results = fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(N)])
    after = db.db_now_ms()
    assert [r.created for r in results] == [True] * N
    stored = list(
        Job.objects.filter(queue__name=QUEUE).order_by("seq").values_list("uid", "payload", "enqueued_at", "run_at")
    )
    assert [s[0] for s in stored] == [r.id for r in results]  # claim order is input order
    assert [s[1] for s in stored] == [f'{{"i":{i}}}' for i in range(N)]
    assert [s[2] for s in stored] == [s[3] for s in stored] == [r.enqueued_at for r in results]
    stamps = [s[2] for s in stored]
    assert stamps == sorted(stamps) and before <= stamps[0] and stamps[-1] <= after  # the database's clock
    if storage.for_connection(connection).supports_one_statement_enqueue:
        assert len(set(stamps)) == 1  # one head statement read the clock for the whole batch
    assert len({r.id for r in results}) == N and all(validation.job_id(r.id) for r in results)
    assert _counters(QUEUE) == {"enqueued": N, "active": N, "deduplicated": 0}
    assert [j.payload for j in fq.claim(QUEUE, count=3)] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_a_large_batch_writes_the_rows_a_small_one_writes():
    """Options, policy defaults and metadata land in the same columns whatever the batch size (path)."""
    fq.configure(QUEUE, max_attempts=7, timeout_ms=5000)
    fq.configure("tests:svc.small", max_attempts=7, timeout_ms=5000)

    def items(n):
        out = []
        for i in range(n):
            item = {"payload": {"i": i, "s": "a\\b\t"}}
            if i % 3 == 1:
                item.update(priority=-5 + i, delay_ms=1000 * i, max_attempts=2, timeout_ms=0)
            if i % 4 == 2:
                item["metadata"] = {"tags": ["t:a", f"n{i}"], "who": "zażółć \\ \n"}
            out.append(item)
        return out

    fq.enqueue_many(QUEUE, items(N))
    small = fq.enqueue_many("tests:svc.small", items(20))
    large = _stored(QUEUE)
    assert large[:20] == _stored("tests:svc.small")
    assert large[1][1:4] == (-4, 0, 2) and large[0][3] == 7 and large[0][5] == 5000
    runs = dict(Job.objects.filter(queue__name=QUEUE).values_list("payload", "run_at"))
    enq = Job.objects.filter(queue__name=QUEUE).values_list("enqueued_at", flat=True)[0]
    assert runs['{"i":4,"s":"a\\\\b\\t"}'] == enq + 4000 and runs['{"i":0,"s":"a\\\\b\\t"}'] == enq
    assert fq.get("tests:svc.small", small[2].id).metadata == {"tags": ["t:a", "n2"], "who": "zażółć \\ \n"}
    assert [j.id for j in fq.jobs(QUEUE, tag="n6").jobs] == [
        Job.objects.filter(queue__name=QUEUE).order_by("seq")[6].uid
    ]


@pytest.mark.parametrize(
    "payload",
    [
        {"unicode": "zażółć ✓ 日本 🎉 \u2028\u2029 \u202e", "combining": "e\u0301"},
        {"escapes": 'quote " backslash \\ tab \t newline \n return \r bell \x07 del \x7f'},
        {"copy syntax": ["\\N", "\\.", "\\t", "\\\\N", "a\\", "\\", "\t\\N\n"]},
        {"nul, written out": "\\u0000", "looks like a tab": "\\t"},
        {"big": 2**70, "neg": -(2**63), "float": 0.1, "exp": 1e300, "small": -1.5e-300},
        "just a string with a \\",
        None,
    ],
)
def test_payloads_round_trip_exactly(payload):
    fq.configure(QUEUE)
    results = fq.enqueue_many(QUEUE, [{"payload": payload}] * N)
    text = validation._COMPACT.encode(payload)
    assert set(Job.objects.filter(queue__name=QUEUE).values_list("payload", "payload_size")) == {
        (text, len(text.encode("utf-8")))
    }
    assert fq.get(QUEUE, results[-1].id).payload == payload
    assert fq.claim(QUEUE)[0].payload == payload


def test_large_payloads_round_trip_and_the_limit_holds(settings):
    settings.FQ_MAX_PAYLOAD_BYTES = 300_000
    fq.configure(QUEUE)
    big = {"blob": "é\\\t" * 40_000}  # 6 bytes of JSON each: 240,000 bytes and the envelope
    text = validation._COMPACT.encode(big)
    assert 200_000 < len(text.encode("utf-8")) <= 300_000
    # Items of different sizes so several COPY chunks are written, the largest first.
    items = [{"payload": big}] + [{"payload": {"i": i, "pad": "x" * (i * 13)}} for i in range(N)]
    results = fq.enqueue_many(QUEUE, items)
    assert fq.get(QUEUE, results[0].id).payload == big
    assert fq.get(QUEUE, results[-1].id).payload == items[-1]["payload"]
    over = [*items, {"payload": {"blob": "x" * 300_000}}]
    with pytest.raises(PayloadTooLarge) as err:
        fq.enqueue_many(QUEUE, over)
    assert err.value.field == f"items[{N + 1}].payload"
    assert rows(QUEUE)["jobs"] == N + 1


# --- all or nothing --------------------------------------------------------------------------------


def test_an_invalid_item_in_the_middle_writes_nothing():
    fq.configure(QUEUE)
    items = [{"payload": {"i": i}} for i in range(N)]
    items[N // 2] = {"payload": {"i": "nul \x00 inside"}}
    with pytest.raises(InvalidJson) as err:
        fq.enqueue_many(QUEUE, items)
    assert err.value.field == f"items[{N // 2}].payload"
    assert rows(QUEUE)["jobs"] == 0


def test_a_large_batch_past_the_queue_full_limit_writes_nothing(settings):
    settings.FQ_MAX_JOBS_PER_QUEUE = N + 10
    fq.configure(QUEUE)
    fq.enqueue_many(QUEUE, [{"payload": i} for i in range(20)])
    sums = _counters(QUEUE)
    with pytest.raises(QueueFull) as err:
        fq.enqueue_many(QUEUE, [{"payload": i} for i in range(N)])
    assert err.value.field == "queue" and f"20 of {N + 10}" in str(err.value)
    assert rows(QUEUE)["jobs"] == 20 and _counters(QUEUE) == sums
    assert len(fq.enqueue_many(QUEUE, [{"payload": i} for i in range(N - 10)])) == N - 10  # exactly the limit


def test_inside_the_callers_transaction_a_rollback_takes_the_batch_with_it():
    fq.configure(QUEUE)
    with pytest.raises(RuntimeError), transaction.atomic():
        results = fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(N)])
        assert rows(QUEUE)["jobs"] == N and fq.get(QUEUE, results[0].id).state == "ready"  # visible inside
        raise RuntimeError
    assert rows(QUEUE)["jobs"] == 0 and _counters(QUEUE)["active"] == 0
    with transaction.atomic():
        results = fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(N)])
    assert rows(QUEUE)["jobs"] == N and _counters(QUEUE)["enqueued"] == N


def test_a_large_batch_into_a_missing_queue_creates_it_unless_told_not_to():
    from django_fq.exceptions import QueueNotFound

    with pytest.raises(QueueNotFound):
        fq.enqueue_many("tests:svc.none", [{"payload": i} for i in range(N)], create_queue=False)
    assert not Queue.objects.filter(name="tests:svc.none").exists()
    assert len(fq.enqueue_many("tests:svc.new", [{"payload": i} for i in range(N)])) == N
    fq.delete_queue("tests:svc.new")  # this process saw it: the next batch finds it gone, creates it again
    assert len(fq.enqueue_many("tests:svc.new", [{"payload": i} for i in range(N)])) == N
    assert rows("tests:svc.new")["jobs"] == N and _counters("tests:svc.new")["active"] == N


# --- tokens and unique keys in large batches ----------------------------------------------------


def test_tokens_of_a_large_batch_are_replayed_with_the_same_ids():
    fq.configure(QUEUE)
    plain = fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(N)])
    items = [{"payload": {"i": i}, "idempotency": f"tok-{i % (N // 2)}"} for i in range(N)]
    first = fq.enqueue_many(QUEUE, items)
    assert [r.created for r in first] == [True] * (N // 2) + [False] * (N - N // 2)
    assert [r.id for r in first[N // 2 :]] == [r.id for r in first[: N - N // 2]]  # coalesced onto the first
    again = fq.enqueue_many(QUEUE, items)
    assert [r.id for r in again] == [r.id for r in first] and not any(r.created for r in again)
    assert rows(QUEUE) == {"jobs": N + N // 2, "leases": 0, "tokens": N // 2}
    assert _counters(QUEUE)["enqueued"] == N + N // 2
    assert not {r.id for r in plain} & {r.id for r in first}


def test_unique_keys_of_a_large_batch_coalesce_onto_active_jobs():
    fq.configure(QUEUE)
    held = fq.enqueue(QUEUE, {"held": True}, unique_key="k-7")
    results = fq.enqueue_many(QUEUE, [{"payload": i, "unique_key": f"k-{i % 100}"} for i in range(N)])
    assert results[7].id == held.id and not results[7].created
    assert sum(r.created for r in results) == 99 and rows(QUEUE)["jobs"] == 100


# --- PostgreSQL: the COPY path itself --------------------------------------------------------------


@pytest.mark.postgres_only
def test_a_large_plain_batch_travels_once_through_copy():
    fq.configure(QUEUE)
    fq.enqueue_many(QUEUE, [{"payload": 0}] * N)  # this process has seen the queue now
    with CaptureQueriesContext(connection) as ctx:
        fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(N)])
    sql = [q["sql"] for q in ctx.captured_queries]
    assert sum(s.startswith("COPY django_fq_job") for s in sql) == 1, sql
    assert not any("json_to_recordset" in s for s in sql), sql
    with CaptureQueriesContext(connection) as ctx:
        fq.enqueue_many(QUEUE, [{"payload": {"i": i}} for i in range(postgres.COPY_MIN_ROWS - 1)])
    assert [("json_to_recordset" in q["sql"]) for q in ctx.captured_queries] == [True]  # one statement below


@pytest.mark.postgres_only
@pytest.mark.parametrize("caller_transaction", [False, True])
def test_a_failure_in_the_middle_of_the_copy_writes_nothing_and_wakes_no_one(monkeypatch, caller_transaction):
    fq.configure(QUEUE)
    taken = fq.enqueue(QUEUE, {"first": True}).id
    sums = _counters(QUEUE)
    real = postgres.new_uids

    def clashing(n):  # the middle item of a COPY batch gets an id a job has already: the unique index refuses it
        uids = real(n)
        if n >= postgres.COPY_MIN_ROWS:
            uids[n // 2] = taken
        return uids

    monkeypatch.setattr(postgres, "new_uids", clashing)
    monkeypatch.setattr(postgres, "COPY_CHUNK_CHARS", 512)  # many chunks: the failure comes mid-stream
    items = [{"payload": {"i": i, "pad": "p" * 40}} for i in range(N)]
    with listening() as listener:
        if caller_transaction:
            with transaction.atomic():
                fq.enqueue("tests:svc.other", {"kept": True})
                with pytest.raises(IntegrityError):
                    fq.enqueue_many(QUEUE, items)
                # The batch had its own savepoint: the caller's transaction goes on.
                fq.enqueue("tests:svc.other", {"kept": 2})
        else:
            with pytest.raises(IntegrityError):
                fq.enqueue_many(QUEUE, items)
            fq.enqueue("tests:svc.other", {"kept": True})
        # Notifications arrive in commit order: the first one heard is the other queue's.
        note = next(listener.notifies(timeout=10), None)
        assert note is not None and note.payload == "tests:svc.other"
    assert list(Job.objects.filter(queue__name=QUEUE).values_list("uid", flat=True)) == [taken]
    assert _counters(QUEUE) == sums
    assert rows("tests:svc.other")["jobs"] == (2 if caller_transaction else 1)
    monkeypatch.setattr(postgres, "new_uids", real)
    assert len(fq.enqueue_many(QUEUE, items)) == N  # and the queue takes the batch afterwards


@pytest.mark.postgres_only
def test_a_committed_batch_wakes_listeners_once():
    fq.configure(QUEUE)
    with listening() as listener:
        fq.enqueue_many(QUEUE, [{"payload": i} for i in range(N)])
        fq.enqueue("tests:svc.other", 1)
        heard = [note.payload for note in listener.notifies(timeout=10, stop_after=2)]
    assert heard == [QUEUE, "tests:svc.other"]


@pytest.mark.postgres_only
def test_text_that_is_not_compact_json_is_still_written_exactly():
    """The store escapes what COPY's text format reads as syntax even in text the JSON encoder never writes."""
    fq.configure(QUEUE)
    store = storage.for_connection(connection)
    odd = ["tab\there", "line\nbreak", "cr\rhere", "back\\slash", "\\N", "all\t\n\r\\\\N", "plain"]
    items = [enqueue_module.parse_options({"payload": i}) for i in range(N)]
    for i, text in enumerate(odd):
        items[i * 30] = items[i * 30]._replace(payload=text, size=len(text.encode()))
    items[1] = items[1]._replace(metadata='{"m":"a\tb"}', tags="|t\n|")
    done, found = store.enqueue_plain(
        connection, QUEUE, items, now=db.now_sql(), max_jobs=10**6, channel=db.NOTIFY_CHANNEL
    )
    assert found and len(done) == N
    stored = list(Job.objects.filter(queue__name=QUEUE).order_by("seq").values_list("payload", "metadata", "tags"))
    assert [s[0] for s in stored] == [it.payload for it in items]
    assert stored[1][1:] == ('{"m":"a\tb"}', "|t\n|")


def test_copy_chunks_escape_only_when_needed():
    items = [enqueue_module.parse_options({"payload": p}) for p in ("a", "b\\c")]
    [chunk] = postgres.copy_chunks(items, ["u1", "u2"], queue_id=3, t=10, max_attempts=5, timeout_ms=0)
    assert chunk.split("\n")[:2] == [
        'u1\t"a"\t3\t0\t10\t5\t0\t\\N\t\\N\t3\tqueued\t10\t10\t0\t0\t\t[]\t',
        'u2\t"b\\\\\\\\c"\t6\t0\t10\t5\t0\t\\N\t\\N\t3\tqueued\t10\t10\t0\t0\t\t[]\t',
    ]
    raw = items[0]._replace(payload="x\ty")
    [chunk] = postgres.copy_chunks([raw], ["u1"], queue_id=3, t=10, max_attempts=5, timeout_ms=0)
    assert chunk.startswith("u1\tx\\ty\t3\t")


def test_new_uids_are_distinct_job_ids():
    uids = postgres.new_uids(1000)
    assert len(set(uids)) == 1000 and all(validation.job_id(u) for u in uids)
    assert postgres.new_uids(0) == []


def test_the_batch_encoder_writes_what_the_compact_encoder_writes():
    encode = validation.batch_encoder()
    values = [{"a": [1, 2.5, None, True]}, "é\\\n\u2028", 2**80, [], {}, {"1": {"2": [{"3": "x"}]}}, -0.0, 1e-320]
    assert [encode(v) for v in values] == [validation._COMPACT.encode(v) for v in values]
    with pytest.raises(ValueError, match="Out of range float"):
        encode(float("nan"))
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        validation.batch_encoder()(cycle)
    with pytest.raises(TypeError, match="not JSON serializable"):
        validation.batch_encoder()({"x": object()})
