"""The stdlib-only HTTP consumer of the docs (``docs/examples/consumer.py``), end to end.

It runs as a separate Python process without site-packages (``-I -S``: the
standard library only) against a live test server, while this process plays
the producer through the same API.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from django_fq import services

from .conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)

CONSUMER = Path(__file__).resolve().parents[2] / "docs" / "examples" / "consumer.py"
Q = "remote:work"


def consumer(base: str, user: str, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(CONSUMER), "--url", base, "--queue", Q, "--user", user, "--password", "pw", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_stdlib_consumer_drains_a_queue_over_http(live_server):
    base = f"{live_server.url}/api/fq"
    producer = make_user("produce", "manage")
    worker = make_user("consume")
    http = requests.Session()
    http.auth = (producer.username, "pw")
    assert http.put(f"{base}/queues/{Q}/", json={"max_attempts": 1}).status_code == 201
    ids = []
    for payload in ({"n": 1}, {"n": 2}, {"fail": "on purpose"}):
        r = http.post(f"{base}/queues/{Q}/jobs/", json={"payload": payload})
        assert r.status_code == 201
        ids.append(r.json()["id"])

    done = consumer(base, worker.username, "--burst", "--wait-ms", "200", "--count", "2")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert {line["id"]: line["outcome"] for line in lines} == {ids[0]: "succeeded", ids[1]: "succeeded", ids[2]: "dead"}

    first = http.get(f"{base}/queues/{Q}/jobs/{ids[0]}/").json()
    assert (first["state"], first["result"]) == ("succeeded", {"handled": {"n": 1}})
    dead = http.get(f"{base}/queues/{Q}/jobs/{ids[2]}/").json()
    assert dead["state"] == "dead"
    assert dead["last_error"] == "RuntimeError: asked to fail: on purpose"
    assert services.stats(Q).counts["succeeded"] == 2


def test_stdlib_consumer_long_polls_for_work(live_server):
    base = f"{live_server.url}/api/fq"
    worker = make_user("consume")
    services.configure(Q)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(CONSUMER), "--url", base, "--queue", Q, "--user", worker.username,
         "--password", "pw", "--burst", "--wait-ms", "3000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        time.sleep(0.5)  # the consumer is waiting inside its claim by now
        job = services.enqueue(Q, {"late": True}).id
        job2 = services.enqueue(Q, {"later": True}).id
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    outcomes = {json.loads(line)["id"]: json.loads(line)["outcome"] for line in out.splitlines()}
    assert outcomes == {job: "succeeded", job2: "succeeded"}


def test_stdlib_consumer_reports_bad_credentials(live_server):
    make_user("consume")
    done = consumer(f"{live_server.url}/api/fq", "nobody-like-this", "--burst", "--wait-ms", "0")
    assert done.returncode == 1
    assert "authentication_failed" in done.stderr or "not_authenticated" in done.stderr
