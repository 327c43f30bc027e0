"""Handler middleware around ``async def`` handlers in a real ``fq_worker`` (``tests.worker.async_mw_settings``).

The middleware ``tests.middleware.mw.both`` has a sync and an async form: an async
handler must get the async one, awaited on the loop, and a sync handler of the same
worker the sync one. ``tests.worker.async_mw.retry_on_value_error_async`` turns the handler's ``ValueError``
into ``RetryAfter`` (its async form, for the async handler).
"""

from __future__ import annotations

import json

import pytest

from django_fq import services as fq
from tests.worker.helpers import WorkerProc

pytestmark = pytest.mark.django_db(transaction=True)

ENV = {"DJANGO_SETTINGS_MODULE": "tests.worker.async_mw_settings"}


def test_async_handlers_run_inside_the_async_form_of_the_middleware(tmp_path):
    path = str(tmp_path / "trail.jsonl")
    fq.configure("t.actl", backoff_ms=60_000)  # only RetryAfter(0) can bring the job back at once
    async_job = fq.enqueue("t.actl", {"trail": path, "value_error_first": True}).id
    sync_job = fq.enqueue("t.ctl", {"trail": path}).id
    proc = WorkerProc("--burst", "--queue=t.actl", "--queue=t.ctl", "--poll-interval=10", "--concurrency=2", env=ENV)
    try:
        assert proc.wait(timeout=60) == 0, proc.stderr
    finally:
        proc.kill()

    with open(path, encoding="utf-8") as fh:
        steps = [json.loads(line) for line in fh]
    assert [(s["mw"], s["attempt"]) for s in steps if s["id"] == async_job] == [
        ("both:async", 1), ("retry:async", 1), ("both:async", 2),
    ]  # fmt: skip
    assert [s["mw"] for s in steps if s["id"] == sync_job] == ["both:sync"]
    info = fq.get("t.actl", async_job)
    assert (info.state, info.attempts, info.result) == ("succeeded", 2, {"ok": True, "attempt": 2, "async": True})
    assert "retrying: first attempt fails" in info.errors[0]["error"]
    assert fq.get("t.ctl", sync_job).state == "succeeded"
