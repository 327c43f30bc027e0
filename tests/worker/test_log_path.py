"""The worker's cheaper log path writes what the stock logging path writes (docs/reference/semantics.md §10: receipts never reach logs).

``emit`` builds its records without ``Logger.makeRecord`` (``logs._record``); the ``fq_worker``
command's handler (``WorkerLogHandler`` + ``WorkerFormatter``) formats a second's time once;
the completer writes an ack batch's ``job.acked`` lines at once (``emit_jobs``), without records
when nobody but that handler would see them. Each is compared here with the stock path.
"""

from __future__ import annotations

import io
import logging
import re
import sys
import time

import pytest

from django_fq.types import ClaimedJob
from django_fq.worker import logs
from django_fq.worker.state import Running

LOGGER = logging.getLogger("django_fq.worker")
#: A line's time (``2026-12-02 00:58:52,772``): the only part two paths may write differently.
TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.M)


def running(n: int, *, attempts: int = 1) -> Running:
    claimed = ClaimedJob(
        id=f"{n:032x}", queue="t.ok", receipt=f"fq1.{n}.1.secret", payload={"n": n}, attempts=attempts,
        max_attempts=25, priority=0, deadline=10_000, enqueued_at=1, claimed_at=2, metadata={},
    )  # fmt: skip
    return Running(claimed, 30_000, time.monotonic(), time.monotonic(), 1 / 3)


@pytest.fixture
def only_handler(monkeypatch):
    """Make a WorkerLogHandler on a StringIO the worker logger's only handler (as fq_worker installs it).

    Called in the test's body: pytest adds its capture handlers to a logger that does not
    propagate when the test starts, after the fixtures are set up.
    """

    def isolate():
        stream = io.StringIO()
        handler = logs.WorkerLogHandler(stream)
        handler.setFormatter(logs.WorkerFormatter(logs.WORKER_LOG_FORMAT))
        monkeypatch.setattr(LOGGER, "handlers", [handler])
        monkeypatch.setattr(LOGGER, "propagate", False)
        monkeypatch.setattr(LOGGER, "level", logging.INFO)
        LOGGER.manager._clear_cache()
        assert logs._sole_plain_handler(logging.INFO) is handler
        return stream, handler

    yield isolate
    LOGGER.manager._clear_cache()


def stock_lines(records: list[logging.LogRecord]) -> str:
    formatter = logging.Formatter(logs.WORKER_LOG_FORMAT)
    return "".join(formatter.format(r) + "\n" for r in records)


def test_record_has_what_make_record_gives():
    kept = {"event": "job.acked", "job": "j1"}
    fast = logs._record(logging.INFO, "job.acked job=j1", kept)
    path, line, func = logs._CALLER
    stock = LOGGER.makeRecord(LOGGER.name, logging.INFO, path, line, "job.acked job=j1", (), None, func, {"fq": kept})
    assert fast.__dict__.keys() == stock.__dict__.keys()
    timing = {"created", "msecs", "relativeCreated"}
    assert {k: v for k, v in fast.__dict__.items() if k not in timing} == {
        k: v for k, v in stock.__dict__.items() if k not in timing
    }
    assert abs(fast.created - stock.created) < 1
    assert abs(fast.relativeCreated - stock.relativeCreated) < 1000
    assert 0 <= fast.msecs < 1000 and isinstance(fast.msecs, float)


def test_record_honours_the_logging_switches(monkeypatch):
    monkeypatch.setattr(logging, "logThreads", False)
    monkeypatch.setattr(logging, "logProcesses", False)
    monkeypatch.setattr(logging, "logMultiprocessing", False)
    record = logs._record(logging.WARNING, "m", {})
    assert (record.thread, record.threadName, record.process, record.processName) == (None, None, None, None)


def test_a_custom_record_factory_is_used(monkeypatch):
    made = []

    def factory(*args, **kwargs):
        record = logging.LogRecord(*args, **kwargs)
        made.append(record)
        return record

    monkeypatch.setattr(logging, "_logRecordFactory", factory)
    record = logs._record(logging.INFO, "m", {"event": "m"})
    assert made == [record] and record.fq == {"event": "m"}


def test_formatter_writes_the_stock_text():
    stock, fast = logging.Formatter(logs.WORKER_LOG_FORMAT), logs.WorkerFormatter(logs.WORKER_LOG_FORMAT)
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    for created in (1767225600.0, 1767225600.999, 1767225601.5, 1767225601.5004):
        record = logging.makeLogRecord({"msg": "job.acked job=j1", "levelno": 20, "levelname": "INFO", "name": LOGGER.name})
        record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
        assert fast.format(record) == stock.format(record)
    record = logging.makeLogRecord({"msg": "worker.internal_error", "levelname": "ERROR", "exc_info": exc_info})
    assert fast.format(record) == stock.format(record)
    assert "ValueError: boom" in fast.format(record)


def test_emit_jobs_writes_the_lines_of_the_record_path(only_handler, caplog):
    stream, _ = only_handler()
    rows = [(running(1), {"ms": 3, "replay": None}), (running(2, attempts=2), {"ms": 0, "replay": True})]
    logs.emit_jobs(logging.INFO, "job.acked", rows)
    fast = stream.getvalue()
    assert TIME.sub("", fast) == (
        f"INFO django_fq.worker: job.acked job={1:032x} queue=t.ok attempt=1/25 ms=3\n"
        f"INFO django_fq.worker: job.acked job={2:032x} queue=t.ok attempt=2/25 ms=0 replay=true\n"
    )
    # With a second handler (pytest's) the records are made, and both get the same lines.
    LOGGER.handlers.append(caplog.handler)
    assert logs._sole_plain_handler(logging.INFO) is None
    with caplog.at_level(logging.INFO, logger=LOGGER.name):
        logs.emit_jobs(logging.INFO, "job.acked", rows)
    records = [r for r in caplog.records if r.name == LOGGER.name]
    assert [r.fq for r in records] == [
        {"event": "job.acked", "job": f"{1:032x}", "queue": "t.ok", "attempt": "1/25", "ms": 3},
        {"event": "job.acked", "job": f"{2:032x}", "queue": "t.ok", "attempt": "2/25", "ms": 0, "replay": True},
    ]
    assert TIME.sub("", stream.getvalue()[len(fast):]) == TIME.sub("", fast) == TIME.sub("", stock_lines(records))


def test_emit_jobs_writes_an_ack_batch_at_once(only_handler):
    stream, _ = only_handler()
    writes = []
    write = stream.write
    stream.write = lambda text: (writes.append(text), write(text))[1]  # type: ignore[method-assign]
    logs.emit_jobs(logging.INFO, "job.acked", [(running(n), {"ms": 0}) for n in range(50)])
    assert len(writes) == 1 and writes[0].count("\n") == 50 and writes[0].count(" job.acked ") == 50
    # Elsewhere, one write per line, as StreamHandler writes.
    logs.emit(logging.INFO, "worker.claim", queue="t.ok", got=1)
    logs.emit(logging.INFO, "worker.claim", queue="t.ok", got=2)
    assert len(writes) == 3


def test_emit_jobs_masks_receipt_shaped_text_and_respects_the_level(only_handler):
    stream, handler = only_handler()
    logs.emit_jobs(logging.INFO, "job.acked", [(running(1), {"ms": 0, "note": "fq1.abc.1.s3cret"})])
    assert "s3cret" not in stream.getvalue() and "note=fq1.[masked]" in stream.getvalue()
    handler.setLevel(logging.WARNING)
    logs.emit_jobs(logging.INFO, "job.acked", [(running(2), {"ms": 0})])
    LOGGER.setLevel(logging.WARNING)
    logs.emit_jobs(logging.INFO, "job.acked", [(running(3), {"ms": 0})])
    assert stream.getvalue().count("job.acked") == 1


def test_held_lines_write_once_in_order(only_handler):
    stream, _ = only_handler()
    writes = []
    write = stream.write
    stream.write = lambda text: (writes.append(text), write(text))[1]  # type: ignore[method-assign]
    with logs.held_lines():
        for n in range(5):
            logs.emit(logging.WARNING, "job.not_settled", job=n)
        assert writes == []
    assert len(writes) == 1
    assert [line.split("job=")[1] for line in TIME.sub("", writes[0]).splitlines()] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("job_id", "queue", "attempts", "max_attempts"),
    [
        (f"{7:032x}", "t.ok", 1, 25),
        ("a b", "t.ok", 1, 25),  # an id written by hand that needs quoting
        (f"{7:032x}", 'q"x', 3, 5),
        ("", "t.ok", 1, 1),
        (f"{7:032x}", "t.ok", True, 25),  # not a plain int: the generic path
        (f"{7:032x}", "t=ok", 2, 2),
    ],
)
def test_job_fields_text_is_fields_text_of_where(job_id, queue, attempts, max_attempts):
    # The per-job part of every job line (Running.logged) takes a shortcut; its text and fields are fields_text's.
    generic = logs.fields_text({"job": job_id, "queue": queue, "attempt": f"{attempts}/{max_attempts}"})
    assert logs.job_fields_text(job_id, queue, attempts, max_attempts) == generic
    claimed = ClaimedJob(
        id=job_id, queue=queue, receipt="", payload=None, attempts=attempts, max_attempts=max_attempts,
        priority=0, deadline=10_000, enqueued_at=1, claimed_at=2,
    )  # fmt: skip
    assert Running(claimed, 30_000, time.monotonic(), time.monotonic(), 1 / 3).logged() == logs.fields_text(
        Running(claimed, 30_000, time.monotonic(), time.monotonic(), 1 / 3).where()
    )
