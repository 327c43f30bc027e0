"""Inputs that reach the database unchecked in the service layer (found while fuzzing the REST API).

The REST API guards against both (its tests pass either way); these tests pin
the service functions themselves, which the CLI, the admin and Python callers
use directly. Expected: the library's own ``FqError`` naming the field, on
every database alike — not a driver error (HTTP 500 over any interface that
does not guard first).
"""

from __future__ import annotations

import pytest

from django_fq import services
from django_fq.exceptions import InvalidArgument, JobNotFound

pytestmark = pytest.mark.django_db

Q = "bugs"


@pytest.mark.parametrize("worker", ["w\ud800", "w\x00x"], ids=["lone-surrogate", "nul"])
def test_claim_rejects_a_worker_id_that_cannot_be_stored(worker):
    """``claim(worker=...)`` is stored as given: a lone surrogate raises UnicodeEncodeError
    (both databases), a NUL raises DataError on PostgreSQL and is stored on SQLite."""
    services.enqueue(Q, 1)
    with pytest.raises(InvalidArgument) as caught:
        services.claim(Q, worker=worker)
    assert caught.value.field == "worker"
    assert services.stats(Q).counts["ready"] == 1  # nothing was claimed


@pytest.mark.parametrize("verb", ["get", "retry", "cancel", "requeue", "wait"])
def test_a_job_id_with_a_nul_is_not_found(verb):
    """PostgreSQL cannot compare text with NUL: ``get(queue, "ab\\x00")`` raises DataError there."""
    services.enqueue(Q, 1)
    call = getattr(services, verb)
    with pytest.raises(JobNotFound):
        call(Q, "ab\x00cd", timeout_ms=0) if verb == "wait" else call(Q, "ab\x00cd")
