"""Behind a transaction-pooling PgBouncer (make test-pgbouncer only): why the listener needs its own alias.

docs/scaling.md ("PgBouncer and other poolers") says a ``LISTEN`` through
transaction pooling hears nothing, so ``FQ_LISTEN_DATABASE`` names a direct
alias, and that a worker whose listener goes through the pooler anyway still
takes its jobs, by polling. These tests check both claims on the real pooler;
on every other leg they are skipped (there is no pooler to go through).
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.db import connections

from django_fq import services as fq
from django_fq import wakeup
from django_fq.db import NOTIFY_CHANNEL
from django_fq.worker import Worker
from tests.listening import listening

from .helpers import record_claims

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.environ.get("FQ_TEST_PG_POOLER") != "transaction",
        reason="only through a transaction-pooling PgBouncer (make test-pgbouncer)",
    ),
]

Q = "tests:pooler"


def test_a_listen_through_the_pooler_hears_nothing_and_one_on_the_listen_alias_hears_the_commit():
    import psycopg

    params = connections["default"].get_connection_params()  # the pooled alias
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    fq.configure(Q)
    with psycopg.connect(**params, autocommit=True) as pooled, listening() as direct:
        pooled.execute(f"LISTEN {NOTIFY_CHANNEL}")  # PgBouncer gives its server session back after this
        fq.enqueue(Q, {})
        heard = next(direct.notifies(timeout=10), None)
        assert heard is not None and heard.payload == Q
        # The direct session has it already: the pooled one would have had it by now too.
        assert list(pooled.notifies(timeout=0.5)) == []


def test_a_worker_whose_listener_goes_through_the_pooler_still_takes_its_jobs_by_polling(settings, monkeypatch):
    del settings.FQ_LISTEN_DATABASE  # the mistake docs/scaling.md warns of: LISTEN on the pooled alias
    wakeup.shutdown_all()  # this process's listener was opened on the direct alias
    fq.configure(Q)
    asks = record_claims(monkeypatch)
    started = threading.Event()
    worker = Worker([Q], handlers={Q: lambda job: started.set()}, poll_interval_ms=50, max_poll_interval_ms=300,
                    reaper=False)  # fmt: skip
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        listener = wakeup.listener()
        assert listener.listen_alias == "default"
        deadline = time.monotonic() + 10
        while len(asks) < 3 and time.monotonic() < deadline:  # idle: its pause has grown
            time.sleep(0.01)
        assert asks[:3] == [(asks[0][0], 0)] * 3
        while not listener.listening and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listener.listening  # as far as it can tell
        mark = listener.mark()
        fq.enqueue(Q, {})
        assert started.wait(30)  # a poll found the job
        assert (asks[0][0], 1) in asks
        assert not listener.wait(mark, {Q}, 0)  # the notification never reached the listener
    finally:
        worker.request_stop("test over")
        thread.join(timeout=30)
        wakeup.shutdown_all()  # the next test's listener goes back to the direct alias
    assert not thread.is_alive()
