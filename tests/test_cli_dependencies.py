"""``manage.py fq enqueue --depends-on`` (repeatable, ``ID[:POLICY]``) and ``fq get`` showing edges; errors in --json."""

from __future__ import annotations

import pytest

from django_fq import services

from .test_cli import fq

pytestmark = pytest.mark.django_db

Q = "cli:deps"


def test_enqueue_depends_on_repeatable_with_a_policy():
    a = services.enqueue(Q, 1).id
    b = services.enqueue(Q, 2).id
    run = fq("enqueue", Q, "3", "--depends-on", a, "--depends-on", f"{b}:run", "--json")
    assert run.code == 0, run.err
    c = run.json["id"]
    got = fq("get", Q, c, "--json").json
    assert got["state"] == "waiting"
    assert sorted((e["id"], e["on_failure"]) for e in got["depends_on"]) == sorted([(a, "cancel"), (b, "run")])
    human = fq("get", Q, c).out
    assert "depends_on" in human and a in human
    listed = fq("jobs", Q, "--state", "waiting", "--json").json
    assert [j["id"] for j in listed["jobs"]] == [c]


@pytest.mark.parametrize(
    "arg, field",
    [("nope", "depends_on[0]"), ("0" * 32, "depends_on[0]"), ("0" * 32 + ":soon", "depends_on[0].on_failure")],
)
def test_bad_depends_on_is_a_json_error_naming_the_field(arg, field):
    run = fq("enqueue", Q, "1", "--depends-on", arg, "--json")
    assert run.code == 1
    assert (run.err_json["code"], run.err_json["field"]) == ("invalid_dependency", field)
    assert fq("stats", Q, "--json").code == 1  # nothing written: the queue does not exist


def test_workflow_show_and_cancel():
    a = services.enqueue(Q, "a").id
    b = services.enqueue(Q, "b", depends_on=[a]).id
    c = services.enqueue(Q, "c", depends_on=[a, b]).id
    shown = fq("workflow", "show", Q, b, "--json").json
    assert [s["id"] for s in shown["steps"]] == [a, b, c]
    tree = fq("workflow", "show", Q, b).out.splitlines()
    assert tree[0].startswith(a) and tree[1].startswith(f"  {b}") and tree[2].startswith(f"    {c}")
    done = fq("workflow", "cancel", Q, c, "--json").json
    assert (done["cancelled"], done["finished"]) == (3, 0)
    assert fq("workflow", "show", Q, "f" * 32, "--json").err_json["code"] == "job_not_found"


def test_enqueue_many_envelopes_take_depends_on():
    a = services.enqueue(Q, "a").id
    lines = f'{{"payload": 1, "depends_on": ["{a}"]}}\n{{"payload": 2, "depends_on": [{{"id": "{a}", "on_failure": "run"}}]}}\n'
    run = fq("enqueue-many", Q, "-", "--json", stdin=lines)
    assert run.code == 0, run.err
    assert [services.get(Q, r["id"]).state for r in run.json] == ["waiting", "waiting"]
    bad = fq("enqueue-many", Q, "-", "--json", stdin='{"payload": 1, "depends_on": ["' + "f" * 32 + '"]}\n')
    assert (bad.code, bad.err_json["field"]) == (1, "items[0].depends_on[0]")


def test_workflow_tree_of_a_deep_chain_stays_narrow():
    """A chain's tree indents at most 20 levels, then names the depth: 10,000 steps printed 100 MB of spaces."""
    ids = [services.enqueue(Q, 0).id]
    for i in range(1, 60):
        ids.append(services.enqueue(Q, i, depends_on=[ids[-1]]).id)
    lines = fq("workflow", "show", Q, ids[0]).out.splitlines()
    assert len(lines) == 60
    assert max(len(line) for line in lines) < 140
    assert lines[-1].lstrip().startswith(f"[59] {ids[-1]}")
    assert lines[5].startswith("  " * 5 + ids[5])


@pytest.mark.parametrize(
    "args, field",
    [
        (["--rate-limit", "NaN"], None),
        (["--rate-limit", "1e3"], None),
        (["--rate-limit", "-1"], "rate_limit"),
        (["--rate-limit", "9" * 5000], None),
        (["--rate-window", "0"], "rate_window_ms"),
        (["--key-concurrency", "100001"], "key_concurrency"),
        (["--ttl", "-5"], "ttl_ms"),
        (["--ttl", str(10**18)], "ttl_ms"),
    ],
)
def test_hostile_config_args_are_refused_and_change_nothing(args, field):
    services.configure(Q, rate_limit=7)
    before = services.policy(Q)
    run = fq("config", Q, *args, "--json")
    assert run.code != 0
    assert "Traceback" not in run.err
    if field is not None:
        assert run.err_json["field"] == field
    assert services.policy(Q) == before
