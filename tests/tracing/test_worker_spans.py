"""Tracing of a real ``fq_worker`` child (django_fq.tracing, ``FQ_TRACING = True``), read through the SDK's in-memory exporter.

The child runs :mod:`tests.tracing_settings`: the capturing app of
:mod:`tests.otel_capture` installs a TracerProvider whose in-memory exporter
also writes every finished span to a file this test reads.
"""

from __future__ import annotations

import pytest
from opentelemetry import trace

from django_fq import services as fq
from tests.otel_capture.exporter import read
from tests.worker.helpers import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.otel"
FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def run_burst(tmp_path, **env: str) -> tuple[WorkerProc, str]:
    """Run ``fq_worker --burst`` on ``t.otel`` with tracing to a spans file; return the finished process and the file."""
    spans = str(tmp_path / "spans.jsonl")
    proc = WorkerProc(
        f"--queue={Q}",
        "--burst",
        *FAST,
        env={"DJANGO_SETTINGS_MODULE": "tests.tracing_settings", "FQ_TEST_SPANS_FILE": spans, **env},
    )
    try:
        assert proc.wait(timeout=120) == 0, proc.stderr
    finally:
        proc.kill()
    return proc, spans


def named(records: list[dict], prefix: str) -> list[dict]:
    return [r for r in records if r["name"].startswith(prefix)]


def of_job(records: list[dict], prefix: str, job_id: str) -> list[dict]:
    """The spans named ``prefix …`` of job ``job_id``, by attempt."""
    found = [r for r in named(records, prefix) if r["attributes"].get("messaging.message.id") == job_id]
    return sorted(found, key=lambda r: r["attributes"]["django_fq.job.attempt"])


def test_each_run_is_a_process_span_ending_with_its_settle_and_the_claims_are_receive_spans(tmp_path):
    fq.configure(Q, backoff_ms=0, max_backoff_ms=0, max_attempts=2)
    ok = fq.enqueue(Q, {"kind": "ok"}).id
    retried = fq.enqueue(Q, {"kind": "fail_once"}).id
    dead = fq.enqueue(Q, {"kind": "fail"}).id
    permanent = fq.enqueue(Q, {"kind": "perm"}).id

    proc, path = run_burst(tmp_path)
    assert "fq_worker: 2 jobs ok, 4 failed" in proc.stdout
    records = read(path)

    runs = {job: of_job(records, "process ", job) for job in (ok, retried, dead, permanent)}
    assert {job: len(spans) for job, spans in runs.items()} == {ok: 1, retried: 2, dead: 2, permanent: 1}
    for spans in runs.values():
        for n, span in enumerate(spans, 1):
            a = span["attributes"]
            assert span["name"] == f"process {Q}" and span["kind"] == "CONSUMER"
            assert a["messaging.system"] == "django_fq" and a["messaging.destination.name"] == Q
            assert a["messaging.operation.type"] == "process" and a["django_fq.job.attempt"] == n
            assert a["django_fq.job.max_attempts"] == 2 and a["django_fq.job.wait_ms"] >= 0
            assert a["django_fq.job.run_ms"] >= 0 and a["django_fq.settle.ms"] >= 0
            assert (
                span["parent"] is None and span["links"] == []
            )  # enqueued without a trace context: a trace of its own

    def outcome(job):
        return [(s["attributes"]["django_fq.job.outcome"], s["status"]) for s in runs[job]]

    assert outcome(ok) == [("ok", "UNSET")]
    assert outcome(retried) == [("failed", "ERROR"), ("ok", "UNSET")]
    assert outcome(dead) == [("failed", "ERROR"), ("failed", "ERROR")]
    assert outcome(permanent) == [("permanent", "ERROR")]
    assert runs[dead][0]["attributes"]["error.type"] == "RuntimeError"
    assert runs[dead][1]["status_description"] == "RuntimeError: boom on attempt 2"
    assert runs[permanent][0]["attributes"]["error.type"] == "PermanentFailure"

    # Each run's span ends with its settle: an event, and attributes saying what the database made of the job.
    def settled(job):
        out = []
        for run in runs[job]:
            [event] = [e for e in run["events"] if e["name"] in ("ack", "nack", "release", "settle")]
            assert event["attributes"]["django_fq.settle.result"] == run["attributes"]["django_fq.settle.result"]
            out.append(
                (event["name"], run["attributes"]["django_fq.settle.result"], run["attributes"]["django_fq.job.state"])
            )
        return out

    assert settled(ok) == [("ack", "acked", "succeeded")]
    assert settled(retried) == [("nack", "nacked", "ready"), ("ack", "acked", "succeeded")]
    assert settled(dead) == [("nack", "nacked", "ready"), ("nack", "nacked", "dead")]
    assert settled(permanent) == [("nack", "nacked", "dead")]

    # The handler's own span is a child of its run's span.
    inner = {r["parent"] for r in named(records, "inner")}
    assert inner == {run["span_id"] for spans in runs.values() for run in spans}

    receives = named(records, f"receive {Q}")
    assert receives and all(
        r["kind"] == "CLIENT" and r["attributes"]["messaging.operation.type"] == "receive" for r in receives
    )
    assert sum(r["attributes"]["messaging.batch.message_count"] for r in receives) == 6  # every claimed run

    # No receipt anywhere: receipts read fq1.<job id>.<generation>.<secret>.
    for record in records:
        attributes = [record["attributes"], *(e["attributes"] for e in record["events"])]
        for key, value in (item for a in attributes for item in a.items()):
            assert "receipt" not in key and "fq1." not in str(value), (record["name"], key)
        assert "fq1." not in str(record["status_description"])
    assert {fq.get(Q, j).state for j in (ok, retried)} == {"succeeded"} and {
        fq.get(Q, j).state for j in (dead, permanent)
    } == {"dead"}


def test_with_tracing_off_the_worker_records_no_span(tmp_path):
    job = fq.enqueue(Q, {"kind": "ok"}).id
    proc, path = run_burst(tmp_path, FQ_TEST_TRACING="0")
    assert "fq_worker: 1 jobs ok, 0 failed" in proc.stdout
    assert fq.get(Q, job).state == "succeeded"
    # The provider and exporter are installed in the child (the handler's own "inner" span is exported), but
    # django-fq made no span: nothing subscribed to the worker's events.
    assert [r["name"] for r in read(path)] == ["inner"]


def hex_ids(span) -> tuple[str, str]:
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")


@pytest.mark.parametrize("mode", ["child", "link"])
def test_the_run_joins_the_trace_of_the_code_that_enqueued_it(tmp_path, settings, producer_spans, mode):
    settings.FQ_TRACING = True
    tracer = trace.get_tracer("tests.producer")
    with tracer.start_as_current_span("request") as request_span:
        job = fq.enqueue(Q, {"kind": "ok"}).id
        [item] = fq.enqueue_many(Q, [{"payload": {"kind": "ok"}, "metadata": {"tags": ["bulk"]}}])
    [create, create_item] = [s for s in producer_spans.get_finished_spans() if s.name == f"create {Q}"]
    assert create.parent.span_id == request_span.get_span_context().span_id and create.kind is trace.SpanKind.PRODUCER
    assert create.attributes["messaging.operation.type"] == "create"
    stored = fq.get(Q, job).metadata["otel"]
    trace_id, create_id = hex_ids(create)
    assert (
        list(stored) == ["traceparent"] and stored["traceparent"][:-2] == f"00-{trace_id}-{create_id}-"
    )  # then the flags
    item_metadata = fq.get(Q, item.id).metadata
    assert item_metadata["tags"] == ["bulk"]  # the caller's own metadata is kept
    assert item_metadata["otel"]["traceparent"][:-2] == f"00-{trace_id}-{hex_ids(create_item)[1]}-"

    _, path = run_burst(tmp_path, **({"FQ_TEST_TRACING_PARENT": mode} if mode == "link" else {}))
    records = read(path)
    for job_id, creator in ((job, create), (item.id, create_item)):
        [run] = of_job(records, "process ", job_id)
        creator_trace, creator_id = hex_ids(creator)
        assert run["links"] == [{"trace_id": creator_trace, "span_id": creator_id}]
        if mode == "child":
            assert (run["trace_id"], run["parent"]) == (creator_trace, creator_id)
        else:
            assert run["parent"] is None and run["trace_id"] != creator_trace
        assert run["attributes"]["django_fq.settle.result"] == "acked"
        [inner] = [r for r in named(records, "inner") if r["parent"] == run["span_id"]]
        assert inner["trace_id"] == run["trace_id"]


MALFORMED = [
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # a string, not a carrier
    {"traceparent": "00-zzzz651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
    {"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    {"traceparent": 42, "tracestate": ["a", {"b": None}]},
    {"traceparent": "00-" + "a" * 3000},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", "tracestate": "=,=,\u00e9"},
    [1, 2, 3],
]


def test_a_malformed_trace_context_in_the_metadata_never_fails_a_run(tmp_path):
    # Written by the producer as plain metadata (tracing off here, so nothing replaces it).
    jobs = [fq.enqueue(Q, {"kind": "ok"}, metadata={"otel": otel}).id for otel in MALFORMED]
    proc, path = run_burst(tmp_path)
    assert f"fq_worker: {len(MALFORMED)} jobs ok, 0 failed" in proc.stdout, proc.stderr
    records = read(path)
    for job in jobs:
        [run] = of_job(records, "process ", job)
        assert run["parent"] is None and run["links"] == []  # no producer context: a root of its own
        assert run["attributes"]["django_fq.job.outcome"] == "ok" and run["status"] == "UNSET"
        assert fq.get(Q, job).state == "succeeded"
    assert "Traceback" not in proc.stderr and "subscriber_error" not in proc.stderr
