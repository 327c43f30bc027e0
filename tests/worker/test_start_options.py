"""Worker options that reach the database are checked at start (docs/reference/cli.md, fq_worker).

A value every claim would refuse (a worker id over 200 characters, one that is
not valid UTF-8 text, a bad queue name) must stop the worker with a one-line
error before it claims anything, not leave the jobs ready behind a run that
looks successful.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from django_fq import services as fq
from django_fq.worker import Worker, WorkerConfigError

from .helpers import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.ok"


def ok_handler(job):
    return None


def ready(queue: str = Q) -> int:
    return fq.stats(queue).counts["ready"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--worker-id=" + "w" * 201],
        ["--worker-id=w\udcff"],  # what Python makes of a non-UTF-8 byte in argv
        ["--worker-id=w\x00x"],
        ["--worker-id="],
        # Supervised children record ID-INDEX: the longest of those must fit in 200 characters.
        ["--worker-id=" + "w" * 199, "--processes=2"],
    ],
    ids=["too-long", "not-utf8", "nul", "empty", "too-long-with-index"],
)
def test_a_worker_id_the_database_would_refuse_stops_the_command_at_start(argv):
    fq.enqueue(Q, {"n": 1})
    with pytest.raises(CommandError, match="--worker-id must be"):
        call_command("fq_worker", f"--queue={Q}", "--burst", "--no-progress", *argv)
    assert ready() == 1


def test_a_non_utf8_worker_id_in_a_real_process_is_one_line_and_exit_1():
    """The argv of a real process: byte 0xff is not UTF-8; the command exits 1 like its other option errors."""
    fq.enqueue(Q, {"n": 1})
    proc = WorkerProc(f"--queue={Q}", "--burst", "--no-progress", "--worker-id=ab\udcff")
    code = proc.wait(60)
    assert code == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "--worker-id must be 1-200 characters of valid UTF-8 text" in proc.stderr
    assert "jobs ok" not in proc.stdout
    assert ready() == 1


def test_a_burst_worker_with_a_too_long_id_does_not_report_success():
    fq.enqueue(Q, {"n": 1})
    proc = WorkerProc(f"--queue={Q}", "--burst", "--no-progress", "--worker-id=" + "w" * 201)
    assert proc.wait(60) != 0
    assert "Traceback" not in proc.stderr and "jobs ok" not in proc.stdout
    assert ready() == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"worker_id": "w" * 201}, "worker_id"),
        ({"worker_id": "w\udcff"}, "worker_id"),
        ({"visibility_ms": 0}, "visibility_ms"),
        ({"max_jobs": 0}, "max_jobs"),
    ],
)
def test_the_python_worker_refuses_what_every_claim_would_refuse(kwargs, message):
    with pytest.raises(WorkerConfigError, match=message):
        Worker([Q], handlers={Q: ok_handler}, burst=True, **kwargs)


def test_the_python_worker_refuses_an_invalid_queue_name_even_with_a_handler_for_it():
    with pytest.raises(WorkerConfigError, match="invalid queue name"):
        Worker(["bad queue"], handlers={"bad queue": ok_handler}, burst=True)


def test_a_valid_long_worker_id_still_works():
    """The check does not refuse what the database takes: exactly 200 characters."""
    fq.enqueue(Q, {"n": 1})
    stats = Worker([Q], handlers={Q: ok_handler}, burst=True, worker_id="w" * 200).run()
    assert stats.ok == 1 and ready() == 0


def test_prefetch_out_of_range_is_an_option_error():
    with pytest.raises(CommandError, match="--prefetch"):
        call_command("fq_worker", f"--queue={Q}", "--burst", "--no-progress", "--prefetch=10001")


def test_no_handler_at_all_says_where_handlers_go():
    """A new project with no handler yet: the error says how to register one (docs/quickstart.md, "A handler")."""
    with pytest.raises(WorkerConfigError) as info:
        Worker([], handlers={}, burst=True)
    message = str(info.value)
    assert message.startswith("no handlers are registered, so there is no queue to serve")
    assert "@handler" in message and "fq_handlers" in message and "FQ_HANDLERS" in message


def test_a_queue_without_a_handler_says_where_handlers_go():
    with pytest.raises(WorkerConfigError) as info:
        Worker(["t.nohandler"], handlers={Q: ok_handler}, burst=True)
    message = str(info.value)
    assert message.startswith("no handler is registered for queue(s): t.nohandler")
    assert "@handler" in message and "fq_handlers" in message and "FQ_HANDLERS" in message
