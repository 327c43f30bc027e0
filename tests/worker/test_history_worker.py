"""A real ``fq_worker`` process tallies the history and writes it (docs/reference/history.md).

The worker runs in its own process; what it claimed, acked and failed is read
from the database by this one, so the rows can only come from the worker's
own writes (its reaper pass or its shutdown).
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.models import Queue, QueueMinute
from django_fq.services import history

from .helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAST = ("--poll-interval=20", "--reaper-interval=100")


def throughput(queue: str) -> tuple[int, int, int, int]:
    rows = QueueMinute.objects.filter(queue__name=queue, kind=history.THROUGHPUT)
    return tuple(sum(getattr(r, f) for r in rows) for f in ("enqueued", "succeeded", "failed", "dead"))


def timings(queue: str, kind: int) -> int:
    return sum(QueueMinute.objects.filter(queue__name=queue, kind=kind).values_list("n", flat=True))


def test_a_worker_writes_what_it_did_at_shutdown(workers):
    fq.configure("t.fail", max_attempts=2, backoff_ms=0)
    fq.enqueue_many("t.ok", [{"payload": {"n": n}} for n in range(7)])
    fq.enqueue_many("t.fail", [{"payload": {"n": n}} for n in range(3)])
    history.flush()  # this process's enqueues: written now, so what follows is the worker's
    assert throughput("t.ok") == (7, 0, 0, 0)
    worker = workers("--queue=t.ok", "--queue=t.fail", "--burst", *FAST)
    assert worker.wait(timeout=60) == 0
    assert throughput("t.ok") == (7, 7, 0, 0)
    # Each t.fail job: two failed attempts (retried, then out of attempts), and it went dead.
    assert throughput("t.fail") == (3, 0, 6, 3)
    assert timings("t.ok", history.WAIT) == 7 and timings("t.ok", history.RUN) == 7
    assert timings("t.fail", history.WAIT) == 6 and timings("t.fail", history.RUN) == 0
    series = history.history_series("t.ok", "hour")["totals"]
    assert series["run_ms"]["count"] == 7 and series["run_ms"]["median"] is not None


def test_a_running_worker_writes_each_minute_once_it_is_over(workers):
    """The reaper pass writes the minutes that ended; the worker need not stop."""
    from django_fq import db

    # The worker's database clock runs 20 s before the end of a minute: that minute ends soon.
    now = db.db_now_ms()
    offset = (40_000 - now % 60_000) % 60_000
    worker = workers("--queue=t.ok", *FAST, clock_offset_ms=offset)
    fq.enqueue("t.ok", {"n": 1})
    wait_until(lambda: fq.stats("t.ok").totals["acked"] == 1, what="the job acked")
    qid = Queue.objects.get(name="t.ok").id
    wait_until(
        lambda: QueueMinute.objects.filter(queue_id=qid, kind=history.THROUGHPUT, succeeded=1).exists(),
        timeout=90,
        what="the worker's reaper writing its minute",
    )
    assert worker.alive()  # written by the running worker, not at its shutdown


def test_a_short_command_writes_its_minute_at_exit():
    """``manage.py fq enqueue`` ends long before its minute does: what it enqueued is written at its exit."""
    import subprocess
    import sys

    from .helpers import ROOT, child_env

    fq.configure("t.cli")
    done = subprocess.run(
        [sys.executable, "-m", "django", "fq", "enqueue", "t.cli", '{"n": 1}'],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert throughput("t.cli") == (1, 0, 0, 0)
