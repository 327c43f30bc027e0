"""``manage.py fq workflow create FILE|-``, ``fq workflow upstream`` and ``fq results``: --json and errors naming the step."""

from __future__ import annotations

import json

import pytest

from django_fq import services
from django_fq.models import Job

from .test_cli import fq

pytestmark = pytest.mark.django_db

Q = "cli:wf"

SPEC = {
    "steps": [
        {"name": "chunk-0", "queue": Q, "payload": {"first": 0}},
        {"name": "chunk-1", "queue": Q, "payload": {"first": 10}},
        {"name": "report", "queue": Q, "payload": "report", "after": ["chunks"], "on_failure": "run"},
    ],
    "groups": {"chunks": ["chunk-0", "chunk-1"]},
}


def test_create_from_stdin_then_read_the_upstream_results(tmp_path):
    run = fq("workflow", "create", "-", "--json", stdin=json.dumps(SPEC))
    assert run.code == 0, run.err
    ids = run.json["ids"]
    assert list(ids) == ["chunk-0", "chunk-1", "report"]
    first = services.claim(Q)[0]
    services.ack(Q, first.receipt, result={"rows": 10})
    second = services.claim(Q)[0]
    services.nack(Q, second.receipt, error="bad rows", permanent=True)
    got = fq("workflow", "upstream", Q, ids["report"], "--json")
    assert got.code == 0, got.err
    entries = {e["name"]: (e["state"], e["result"]) for e in got.json["upstream"]}
    assert entries == {"chunk-0": ("succeeded", {"rows": 10}), "chunk-1": ("dead", None)}
    assert fq("results", Q, ids["report"], "--json").json == got.json
    human = fq("results", Q, ids["report"]).out
    assert 'chunk-0  cli:wf  succeeded  {"rows": 10}' in human and "chunk-1  cli:wf  dead  (no result)" in human
    path = tmp_path / "wf.json"
    path.write_text(json.dumps({"steps": [{"name": "x", "queue": Q, "payload": 1}]}))
    made = fq("workflow", "create", str(path))
    assert made.code == 0 and made.out.startswith("x  ")


@pytest.mark.parametrize(
    "text, code, field",
    [
        ("{", "invalid_json", "source"),
        (
            json.dumps({"steps": [{"name": "a", "queue": Q, "payload": 1, "after": ["b"]}]}),
            "invalid_workflow",
            "steps[a].after[0]",
        ),
        (
            json.dumps({"steps": [{"name": "a", "queue": Q, "payload": 1, "options": {"priority": "x"}}]}),
            "invalid",
            "steps[a].options.priority",
        ),
    ],
)
def test_create_errors_name_the_step_in_json_and_write_nothing(text, code, field):
    run = fq("workflow", "create", "-", "--json", stdin=text)
    assert run.code == 1
    assert (run.err_json["code"], run.err_json["field"]) == (code, field)
    assert not Job.objects.exists()


def test_arguments_of_each_action():
    assert fq("workflow", "create", "-", "f" * 32, "--json").err_json["field"] == "job_id"
    assert fq("workflow", "upstream", Q, "--json").err_json["field"] == "job_id"
    services.configure(Q)
    assert fq("results", Q, "f" * 32, "--json").err_json["code"] == "job_not_found"
