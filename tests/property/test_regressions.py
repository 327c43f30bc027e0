"""Focused tests for what the state machine and the fuzz tests found, one per finding."""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt, ReceiptCancelled

pytestmark = pytest.mark.django_db

Q = "prop:regress"


def _with_generation(receipt: str, generation: int | str) -> str:
    prefix, uid, _, secret = receipt.split(".")
    return f"{prefix}.{uid}.{generation}.{secret}"


def test_a_settle_repeated_with_an_edited_generation_is_refused_not_replayed():
    """docs/reference/semantics.md §9: only the very same receipt replays a settle; one with its generation edited is forged.

    Found by the state machine: ``_replay_or_error`` compared the secret only,
    so ``fq1.<id>.<gen±1>.<secret>`` replayed the recorded nack.
    """
    fq.enqueue(Q, {"n": 1})
    [first] = fq.claim(Q)
    assert fq.nack(Q, first.receipt, delay_ms=0, error="boom").state == "ready"
    gen = int(first.receipt.split(".")[2])
    for other in (gen + 1, gen - 1, 0, 10**17):
        with pytest.raises(InvalidReceipt) as err:
            fq.nack(Q, _with_generation(first.receipt, other), delay_ms=0, error="boom")
        assert type(err.value) is InvalidReceipt
    # While a newer lease is held, the old secret with the new generation is refused too.
    [second] = fq.claim(Q)
    assert second.receipt.split(".")[2] == str(gen + 1)
    with pytest.raises(InvalidReceipt):
        fq.nack(Q, _with_generation(first.receipt, gen + 1), delay_ms=0, error="boom")
    # The true repeat is still a replay, and nothing above touched the live lease.
    replay = fq.nack(Q, first.receipt, delay_ms=0, error="boom")
    assert replay.replay and replay.state == "ready"
    assert fq.get(Q, first.id).state == "running" and fq.get(Q, first.id).attempts == 2
    assert fq.ack(Q, second.receipt).state == "succeeded"


def test_a_cancelled_jobs_receipt_with_an_edited_generation_is_plainly_invalid():
    fq.enqueue(Q, {"n": 2})
    [job] = fq.claim(Q)
    fq.cancel(Q, job.id)
    with pytest.raises(ReceiptCancelled):
        fq.ack(Q, job.receipt)
    with pytest.raises(InvalidReceipt) as err:
        fq.ack(Q, _with_generation(job.receipt, 2))
    assert type(err.value) is InvalidReceipt


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda r: r + "\n", id="trailing-newline"),
        pytest.param(lambda r: _with_generation(r, "0" + r.split(".")[2]), id="generation-leading-zero"),
        pytest.param(lambda r: _with_generation(r, "00" + r.split(".")[2]), id="generation-two-zeros"),
    ],
)
@pytest.mark.parametrize("op", ["ack", "nack", "release", "extend"])
def test_only_the_exact_receipt_text_is_accepted(edit, op):
    """Found by the state machine: ``fq1.<id>.02.<secret>`` and ``<receipt>\\n`` settled a live lease.

    The receipt pattern allowed leading zeros in the generation and, matched
    with ``$``, a trailing newline. Any text but the one claim() handed out is
    a malformed receipt: refused, and the lease stays as it was.
    """
    fq.enqueue(Q, {"n": 3})
    [job] = fq.claim(Q, visibility_ms=600_000)
    forged = edit(job.receipt)
    assert forged != job.receipt
    calls = {
        "ack": lambda r: fq.ack(Q, r),
        "nack": lambda r: fq.nack(Q, r, delay_ms=0),
        "release": lambda r: fq.release(Q, r),
        "extend": lambda r: fq.extend(Q, r, visibility_ms=1000),
    }
    with pytest.raises(InvalidReceipt):
        calls[op](forged)
    info = fq.get(Q, job.id)
    assert (info.state, info.attempts, info.lease_deadline) == ("running", 1, job.deadline)
    calls[op](job.receipt)  # the real one still works


@pytest.mark.parametrize("path", ["\x00", "a\x00b", "\ud800", "", "/", "/proc/self/mem", "/nonexistent-dir/a\nb"])
@pytest.mark.parametrize(
    "argv, field",
    [(["export", "--output"], "output"), (["import"], "source"), (["enqueue-many", Q], "source")],
)
def test_file_arguments_the_system_cannot_use_are_one_line_errors(argv, field, path):
    """Found by the CLI fuzz test: a NUL byte or lone surrogate in a path, a directory or an empty path as
    the export's output, and a file that opens but cannot be read, ended ``fq`` with a traceback."""
    from tests.test_cli import fq as cli

    if path in ("", "/") and argv[0] != "export":
        return  # reading "" or "/" was already a clean error
    if path == "/proc/self/mem" and argv[0] == "export":
        return  # not a path one writes to
    fq.configure(Q)
    for as_json in (False, True):
        run = cli(*argv, path, *(["--json"] if as_json else []))
        assert run.code == 1 and run.out == "", (run.code, run.out, run.err)
        assert "Traceback" not in run.err and run.err.count("\n") == 1, run.err
        if as_json:
            import json

            assert json.loads(run.err)["field"] == field
        else:
            assert run.err.startswith(f"fq {argv[0]}: error: ")
    assert [q.name for q in fq.queues()] == [Q]


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("post", "jobs/", b'{"payload": 1, "\\ud800": 1}'),
        ("post", "jobs/bulk/", b'{"jobs": [{"payload": 1, "x\\udfff": 2}]}'),
        ("patch", "", b'{"\\ud800": 1}'),
        ("post", "claim/", b'{"\\udc00": 1}'),
    ],
)
def test_an_error_quoting_a_lone_surrogate_is_a_400_not_a_500(settings, method, path, body):
    """Found by the API fuzz test: ``{"\\ud800": 1}`` named an unknown field whose name no UTF-8
    response can carry, and rendering the error failed with a 500. The name is now escaped."""
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    settings.ROOT_URLCONF = "tests.api.urls"
    fq.configure(Q)
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("s", "s@example.com", "pw"))
    client.raise_request_exception = False
    response = getattr(client, method)(f"/api/fq/queues/{Q}/{path}", data=body, content_type="application/json")
    assert response.status_code == 400, response.content[:200]
    err = response.json()
    assert err["code"] == "invalid" and "\\ud" in err["field"], err
    assert fq.stats(Q).totals["enqueued"] == 0


@pytest.mark.parametrize("text", ["1_0", "\u0663", "\uff13", "0x10", "1e3", "1.0", ""])
def test_integer_options_take_ascii_decimal_digits_only(text):
    """Found by the CLI fuzz test: ``--count 1_0`` claimed ten jobs and ``--count ٣`` three, as Python's
    ``int()`` reads them, while the REST API refuses both. Options now take [+-]digits only."""
    from tests.test_cli import fq as cli

    for i in range(12):
        fq.enqueue(Q, {"n": i})
    run = cli("claim", Q, "--count", text)
    assert run.code == 2 and "--count" in run.err and "invalid int value" in run.err, run
    assert fq.stats(Q).counts["running"] == 0
    assert cli("claim", Q, "--count", " +2 ", "--json").code == 0
    assert fq.stats(Q).counts["running"] == 2


@pytest.mark.parametrize("name", ["fz\x00", "a\x00b", "\ud800", "", "a" * 201, "bad name"])
def test_ack_refuses_an_invalid_queue_name_before_any_sql(name):
    """Found by the slow API fuzz test on PostgreSQL: ack's one-statement path sent the queue name to
    the database unchecked, and a NUL byte in it was a DataError (a 500 over REST)."""
    from django_fq.exceptions import InvalidQueueName

    fq.enqueue(Q, {"n": 1})
    [job] = fq.claim(Q)
    with pytest.raises(InvalidQueueName) as err:
        fq.ack(name, job.receipt)
    assert err.value.field == "queue"
    with pytest.raises(InvalidQueueName):
        fq.ack_many(name, [(job.receipt, None)])
    assert fq.get(Q, job.id).state == "running"


def test_every_verb_refuses_an_invalid_queue_name_before_any_sql():
    """The whole kind of the finding above: every verb taking a queue name, on either database."""
    import io

    from django_fq import backup, health
    from django_fq.exceptions import InvalidQueueName

    fq.enqueue(Q, {"n": 1})
    [job] = fq.claim(Q)
    r = job.receipt
    calls = {
        "enqueue": lambda q: fq.enqueue(q, 1), "enqueue_many": lambda q: fq.enqueue_many(q, [{"payload": 1}]),
        "claim": lambda q: fq.claim(q), "ack": lambda q: fq.ack(q, r), "ack_many": lambda q: fq.ack_many(q, [(r, 1)]),
        "nack": lambda q: fq.nack(q, r), "release": lambda q: fq.release(q, r),
        "extend": lambda q: fq.extend(q, r, visibility_ms=1000), "get": lambda q: fq.get(q, job.id),
        "jobs": lambda q: fq.jobs(q), "stats": lambda q: fq.stats(q), "retry": lambda q: fq.retry(q, job.id),
        "requeue": lambda q: fq.requeue(q, job.id), "cancel": lambda q: fq.cancel(q, job.id),
        "wait": lambda q: fq.wait(q, job.id, timeout_ms=0), "reap": lambda q: fq.reap(q),
        "configure": lambda q: fq.configure(q, max_attempts=2), "policy": lambda q: fq.policy(q),
        "delete_queue": lambda q: fq.delete_queue(q), "health": lambda q: health.check(q),
        "export": lambda q: backup.export_jsonl(io.StringIO(), [q]),
    }  # fmt: skip
    wrong = []
    for verb, call in calls.items():
        for name in ("a\x00", "\ud800", "", "x" * 201):
            try:
                call(name)
                wrong.append((verb, name, "accepted"))
            except InvalidQueueName:
                pass
            except Exception as exc:
                wrong.append((verb, name[:5], repr(exc)[:80]))
    assert wrong == []
    assert fq.get(Q, job.id).state == "running"
