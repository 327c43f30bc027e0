"""A handler that forks without exec in a ``fq_worker --pool processes`` child (real worker processes).

The copy made by ``os.fork()`` returns from the handler too. It must not answer
for the job (its result is not the handler's), nor stay to read the next jobs
from the pipe: it ends at once when it leaves the handler (django_fq/worker/procpool.py).
"""

from __future__ import annotations

import pytest

from django_fq import services as fq

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.fork"
PROC = ("--pool=processes", f"--queue={Q}", "--poll-interval=10", "--max-poll-interval=50", "--reaper-interval=50")


def test_the_copy_of_a_forking_handler_neither_answers_nor_takes_the_next_jobs(workers, events):
    forked = fq.enqueue(Q, {"events": events.path, "fork": True}, priority=10).id
    plain = [fq.enqueue(Q, {"events": events.path, "n": n}).id for n in range(3)]
    w = workers(*PROC, "--burst", "--concurrency=1")
    assert w.wait(timeout=120) == 0, w.stderr
    assert fq.get(Q, forked).result == {"from": "child"}
    for n, job in enumerate(plain):
        info = fq.get(Q, job)
        assert (info.state, info.result) == ("succeeded", {"from": "plain", "n": n})
        assert len(events.of("start", job)) == 1  # each job really ran, once
    assert "4 jobs ok, 0 failed" in w.stdout
