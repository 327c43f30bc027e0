"""A real ``fq_worker`` at ``--verbosity 3`` with every logger (SQL included) on stderr never prints a receipt.

The receipts a worker holds are never seen by the test, so the output is
searched through the hashes the database keeps: no 43-character window of
stdout or stderr may hash to a receipt hash stored on a lease or a settled
job (see :func:`tests.security.helpers.secrets_matching`).
"""

from __future__ import annotations

import signal

import pytest

from django_fq import services as fq
from django_fq.models import Job, Lease
from tests.worker.helpers import Events

from .helpers import secrets_matching

pytestmark = pytest.mark.django_db(transaction=True)

FAST = ("--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")
DEBUG_SETTINGS = {"DJANGO_SETTINGS_MODULE": "tests.security.worker_debug_settings"}


def _stored_hashes() -> set[str]:
    hashes = set(Lease.objects.values_list("receipt_hash", flat=True))
    hashes |= set(Job.objects.exclude(settled_hash=None).values_list("settled_hash", flat=True))
    return hashes


def test_worker_output_at_full_verbosity_holds_no_receipt(workers, tmp_path):
    events = Events(tmp_path / "events.jsonl")
    for n in range(3):
        fq.enqueue("t.ok", {"n": n})
    fq.enqueue("t.fail", {})  # nack
    fq.enqueue("t.perm", {})  # dead at once
    fq.enqueue("t.cancelself", {})  # the ack is refused: cancelled
    fq.enqueue("t.ctl", {"sleep_ms": 700, "events": events.path})  # outlives --visibility: heartbeats extend it
    burst = workers(
        "--queue=t.ok", "--queue=t.fail", "--queue=t.perm", "--queue=t.cancelself", "--queue=t.ctl",
        "--burst", "--concurrency=2", "--visibility=300", "--verbosity=3", *FAST, env=DEBUG_SETTINGS,
    )  # fmt: skip
    assert burst.wait(timeout=120) == 0, burst.stderr

    # A second worker is stopped while its job runs: the job is released with its receipt.
    gate = tmp_path / "gate"
    held = fq.enqueue("t.ctl", {"gate": str(gate), "events": events.path}).id
    stopping = workers("--queue=t.ctl", "--grace=0", "--verbosity=3", *FAST, env=DEBUG_SETTINGS)
    events.wait_for("start", held)
    stopping.signal(signal.SIGTERM)
    assert stopping.wait(timeout=60) == 0, stopping.stderr

    output = burst.stdout + burst.stderr + stopping.stdout + stopping.stderr
    # The output is the full one: SQL with parameters, and every kind of job event.
    assert "django_fq_lease" in output and "args=" in output
    worker_lines = [line for line in output.splitlines() if "django_fq.worker" in line]
    for event in ("worker.claim", "job.acked", "job.released"):
        assert any(event in line for line in worker_lines), event
    # The cancelled job: refused at its ack, or seen lost by a heartbeat first (load decides which).
    assert any("cancelled" in line for line in worker_lines)
    assert fq.get("t.perm", Job.objects.get(queue__name="t.perm").uid).state == "dead"
    assert fq.get("t.ctl", held).state == "ready"
    hashes = _stored_hashes()
    assert len(hashes) >= 7  # the settles recorded their receipts' hashes
    assert "fq1." not in output
    assert secrets_matching(output, hashes) == []


def test_the_search_finds_a_secret_by_its_stored_hash():
    """The search above is not vacuous: a secret buried in other text is found through the lease's hash."""
    fq.enqueue("t.ok", {})
    [job] = fq.claim("t.ok")
    secret = job.receipt.rsplit(".", 1)[1]
    text = f"INFO something x{secret}y and more abc-DEF_123" + "z" * 60
    assert secrets_matching(text, _stored_hashes()) == [secret]
    assert secrets_matching(text.replace(secret, secret[::-1]), _stored_hashes()) == []
