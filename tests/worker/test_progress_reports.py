"""``JobContext.progress`` and the throttle of :class:`ProgressReports`, without a worker or a database."""

from __future__ import annotations

import math
import threading

import pytest

from django_fq.exceptions import InvalidArgument
from django_fq.worker import JobContext
from django_fq.worker.context import PROGRESS_INTERVAL_S, ProgressReports


def context() -> JobContext:
    return JobContext(id="j", queue="q", payload={}, attempts=1, max_attempts=3, deadline=0, enqueued_at=0)


class Writer:
    """Stands for the heartbeat: records the wake-ups a report asks for."""

    def __init__(self):
        self.wakes: list[float] = []

    def wake_before(self, due: float) -> None:
        self.wakes.append(due)


def test_reports_are_kept_and_bad_ones_raise_naming_the_field():
    job = context()
    assert job.reported is None
    job.progress(10, "a")
    job.progress(20.5)
    assert job.reported == (20.5, "")
    for value in (math.nan, -1, 101, "5", None, True):
        with pytest.raises(InvalidArgument) as err:
            job.progress(value, "bad")
        assert err.value.field == "progress"
    with pytest.raises(InvalidArgument) as err:
        job.progress(5, "x" * 201)
    assert err.value.field == "message"
    assert job.reported == (20.5, "")  # a refused report changes nothing


def test_only_the_first_report_after_a_write_wakes_the_writer():
    job = context()
    job._writer = writer = Writer()
    job.progress(1)
    job.progress(2)
    assert writer.wakes == [-math.inf]  # due at once: the first report of a run is written at once
    reports = job._reports
    assert reports is not None
    assert reports.take(100.0) == (2.0, "")  # the latest report, not the first
    reports.written()
    job.progress(3)
    assert writer.wakes == [-math.inf, 100.0 + PROGRESS_INTERVAL_S]  # the next write a second later
    job.progress(4)
    assert len(writer.wakes) == 2


def test_take_waits_out_the_second_and_one_writer_at_a_time():
    reports = ProgressReports()
    reports.put((1.0, "a"))
    assert reports.take(50.0) == (1.0, "a")
    reports.put((2.0, "b"))
    assert reports.take(50.5) is None  # in flight, and not yet due
    reports.written()
    assert reports.take(50.0 + PROGRESS_INTERVAL_S - 0.001) is None
    assert reports.take(50.0 + PROGRESS_INTERVAL_S) == (2.0, "b")
    reports.put((3.0, "c"))
    # Once the handler returned, the last report waits only for the write in flight, not the second.
    threading.Timer(0.05, reports.written).start()
    assert reports.take_last(timeout_s=5) == (3.0, "c")
    reports.written()
    assert reports.take_last(timeout_s=5) is None  # nothing pending
