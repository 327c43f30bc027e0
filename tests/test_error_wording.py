"""Error messages a new user found awkward: "job not found" read three ways, and some repeated themselves.

* ``no job <id> in queue <queue>`` on every verb (``get``, ``retry``,
  ``requeue``, ``cancel``, ``wait``) of the Python API and ``fq``; a malformed
  id is "not a job id: job ids are 32 lowercase hex characters". Both stay
  :class:`JobNotFound` (``job_not_found``, field ``job_id``).
* ``fq`` adds ``(OPTION)`` after a message only when the message does not
  name it already: ``items[1].priority must be an integer``, not
  ``… (items[1].priority)``.
* A task option out of range says its range once.
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import JobNotFound
from tests.test_cli import fq as run_fq

pytestmark = pytest.mark.django_db

Q = "wording:test"
UNKNOWN = "0" * 32
MALFORMED = "not a job id: job ids are 32 lowercase hex characters"
VERBS = {
    "get": lambda job_id: fq.get(Q, job_id),
    "retry": lambda job_id: fq.retry(Q, job_id),
    "requeue": lambda job_id: fq.requeue(Q, job_id),
    "cancel": lambda job_id: fq.cancel(Q, job_id),
    "wait": lambda job_id: fq.wait(Q, job_id, timeout_ms=0),
}


@pytest.fixture(autouse=True)
def queue():
    fq.enqueue(Q, {"n": 1})


@pytest.mark.parametrize("verb", VERBS)
def test_an_unknown_job_reads_the_same_on_every_verb(verb):
    with pytest.raises(JobNotFound) as caught:
        VERBS[verb](UNKNOWN)

    assert caught.value.message == f"no job {UNKNOWN} in queue {Q}"
    assert (caught.value.code, caught.value.field) == ("job_not_found", "job_id")


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("job_id", ["nosuchjob", "A" * 32, "", 42])
def test_a_malformed_job_id_is_said_to_be_no_job_id(verb, job_id):
    with pytest.raises(JobNotFound) as caught:
        VERBS[verb](job_id)

    assert caught.value.message == MALFORMED
    assert (caught.value.code, caught.value.field) == ("job_not_found", "job_id")


@pytest.mark.parametrize("verb", ["get", "retry", "requeue", "cancel"])
def test_the_command_line_says_it_once(verb):
    unknown = run_fq(verb, Q, UNKNOWN)
    malformed = run_fq(verb, Q, "nosuchjob")

    assert (unknown.code, malformed.code) == (1, 1)
    assert unknown.err.strip() == f"fq {verb}: error: no job {UNKNOWN} in queue {Q} (JOB_ID)"
    assert malformed.err.strip() == f"fq {verb}: error: {MALFORMED} (JOB_ID)"


def test_enqueue_many_names_the_item_once(tmp_path):
    source = tmp_path / "items.json"
    source.write_text('[{"payload": 1}, {"payload": 2, "priority": "x"}]')

    run = run_fq("enqueue-many", Q, source)

    assert run.code == 1
    assert run.err.strip() == "fq enqueue-many: error: items[1].priority must be an integer"


def test_an_option_the_message_does_not_name_is_still_added():
    run = run_fq("enqueue", Q, "{}", "--max-attempts", 0)

    assert run.code == 1
    assert run.err.strip() == "fq enqueue: error: max_attempts must be between 1 and 1000 (--max-attempts)"
