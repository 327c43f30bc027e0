"""A crafted backup file: tokens naming another queue's job, oversized error history (from a security review of fq import)."""

from __future__ import annotations

import io
import json

import pytest

from django_fq import backup
from django_fq import services as fq
from django_fq.exceptions import InvalidBackup, JobNotFound
from django_fq.models import IdempotencyToken, Job

pytestmark = pytest.mark.django_db

HEADER = {"format": "django-fq", "version": 1}


def _job(queue: str, uid: str, **extra) -> dict:
    return {
        "type": "job", "queue": queue, "id": uid, "state": "ready", "priority": 0, "run_at": 0,
        "enqueued_at": 0, "attempts": 0, "max_attempts": 3, "payload": {}, **extra,
    }  # fmt: skip


def _token(queue: str, token: str, job_id: str) -> dict:
    return {"type": "token", "queue": queue, "token": token, "job_id": job_id, "created_at": 0, "expires_at": 2**52}


def _text(*objs) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def test_a_token_cannot_name_a_job_of_another_queue_whatever_the_line_order():
    """6dbc00d refuses a token whose job_id names a job of another queue; the check only sees jobs already
    inserted, so a job still waiting in the import's batch (or one later in the file) slips through once
    500 token lines make the tokens flush first."""
    x = "a" * 32
    lines = [HEADER, {"type": "queue", "name": "review.a"}, _job("review.a", x), {"type": "queue", "name": "review.b"}]
    lines += [_token("review.b", "stolen", x)] + [_token("review.b", f"t{i}", "f" * 32) for i in range(499)]

    with pytest.raises(InvalidBackup) as err:
        backup.import_jsonl(io.StringIO(_text(*lines)))

    assert err.value.field == "job_id"
    assert not IdempotencyToken.objects.filter(token="stolen").exists()


def test_a_cross_queue_token_slipped_in_makes_enqueue_answer_with_a_job_get_cannot_find():
    """What the slipped token does (the reason 6dbc00d refuses it): an enqueue into review.b returns review.a's job id."""
    x = "b" * 32
    lines = [HEADER, {"type": "queue", "name": "review.a"}, _job("review.a", x), {"type": "queue", "name": "review.b"}]
    lines += [_token("review.b", "stolen", x)] + [_token("review.b", f"t{i}", "f" * 32) for i in range(499)]
    try:
        backup.import_jsonl(io.StringIO(_text(*lines)))
    except InvalidBackup:
        return  # refused: fixed
    made = fq.enqueue("review.b", {"n": 1}, idempotency="stolen")
    assert made.id != x, "enqueue into review.b answered with the id of a job of review.a"
    with pytest.raises(JobNotFound):
        fq.get("review.b", made.id)


def test_the_error_history_of_an_imported_job_is_bounded_like_the_engines():
    """The module docstring: 'The error history is cut to the engine's caps ... each error text cut to 64 KiB'.
    Only the "error" key is cut; any other key of an entry (worker, or any key at all) is stored at any size,
    so a backup can plant an unbounded history (100 entries of any size) that every job detail then serves."""
    big = "x" * (1024 * 1024)
    errors = [{"at": 0, "attempt": 1, "kind": "nack", "error": "e", "worker": big, "junk": big} for _ in range(3)]
    text = _text(HEADER, {"type": "queue", "name": "review.h"}, _job("review.h", "c" * 32, errors=errors))

    try:
        backup.import_jsonl(io.StringIO(text))
    except InvalidBackup:
        return  # refused: fine
    stored = Job.objects.get(uid="c" * 32).errors
    sizes = [len(json.dumps(e)) for e in stored]
    assert max(sizes) <= 64 * 1024 + 1024, f"imported error history entries of {sizes} bytes (cap: 64 KiB of text)"


def test_a_job_after_a_token_of_another_queue_naming_it_is_refused():
    """The other order: the token line comes first, the job line later in the file."""
    x = "c" * 32
    lines = [HEADER, {"type": "queue", "name": "review.b"}, _token("review.b", "stolen", x)]
    lines += [{"type": "queue", "name": "review.a"}, _job("review.a", x)]

    with pytest.raises(InvalidBackup) as err:
        backup.import_jsonl(io.StringIO(_text(*lines)))

    assert (err.value.line, err.value.field) == (5, "id") and "review.b" in err.value.message
    assert not Job.objects.exists() and not IdempotencyToken.objects.exists()
