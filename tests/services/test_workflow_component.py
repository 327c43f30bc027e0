"""The walk of a workflow (services.dependencies.component): one recursive statement whatever the depth.

docs/admin.md "Workflow graph" and ``fq workflow show`` read every job connected
to one job by dependencies, each way, at most a cap of jobs (the admin's 500,
``show``'s 10,000), the nearest first; the query count does not grow with the
workflow's depth, on every database.
"""

from __future__ import annotations

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_fq import conf, workflows
from django_fq import services as fq
from django_fq.services import dependencies
from django_fq.workflows import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

Q = "t.component"
DEPTH = 500


def _chain(n: int) -> list[str]:
    wf = Workflow()
    wf.chain(*(wf.step(Q, i, name=f"s{i}") for i in range(n)))
    ids = wf.enqueue()
    return [ids[f"s{i}"] for i in range(n)]


def _walk(job_id: str, limit: int):
    with CaptureQueriesContext(connections[conf.database()]) as queries:
        nodes, edges, truncated = dependencies.component(job_id, limit=limit)
    return nodes, edges, truncated, len(queries)


def test_a_500_deep_chain_is_read_in_three_queries_from_either_end_or_the_middle():
    chain = _chain(DEPTH)
    for start in (chain[0], chain[DEPTH // 2], chain[-1]):
        nodes, edges, truncated, count = _walk(start, limit=1000)
        assert not truncated
        assert {n["uid"] for n in nodes.values()} == set(chain)
        by_uid = {n["uid"]: seq for seq, n in nodes.items()}
        # Every link of the chain, each once, as (job, upstream).
        assert sorted(edges) == sorted((by_uid[chain[i + 1]], by_uid[chain[i]]) for i in range(DEPTH - 1))
        # The job's seq, the recursive walk with its edges, the details of the 500 jobs.
        assert count == 3, count


def test_the_cap_reads_the_nearest_jobs_and_says_truncated():
    chain = _chain(DEPTH)
    nodes, edges, truncated, count = _walk(chain[-1], limit=100)
    assert truncated
    assert {n["uid"] for n in nodes.values()} == set(chain[-100:])
    assert len(edges) == 99
    assert count == 3
    # Exactly the cap is not truncated.
    nodes, _, truncated, _ = _walk(chain[-1], limit=DEPTH)
    assert not truncated and len(nodes) == DEPTH


def test_the_walk_goes_both_ways_and_stays_in_the_component():
    a = fq.enqueue(Q, "a").id
    b = fq.enqueue(Q, "b", depends_on=[a]).id
    c = fq.enqueue(Q, "c", depends_on=[a]).id
    d = fq.enqueue(Q, "d", depends_on=[b, c]).id
    e = fq.enqueue(Q, "e", depends_on=[c]).id
    other = fq.enqueue(Q, "other").id
    fq.enqueue(Q, "other-child", depends_on=[other])
    nodes, edges, truncated, count = _walk(b, limit=1000)  # from a middle step: up to a, across to c, e
    assert {n["uid"] for n in nodes.values()} == {a, b, c, d, e}
    assert len(edges) == 5 and not truncated and count == 3
    states = {n["uid"]: n["state"] for n in nodes.values()}
    assert states[a] == "ready" and states[d] == "waiting"
    nodes, edges, truncated, _ = _walk(other, limit=1000)
    assert len(nodes) == 2 and len(edges) == 1
    lone = fq.enqueue(Q, "lone").id
    nodes, edges, truncated, _ = _walk(lone, limit=1000)
    assert [n["uid"] for n in nodes.values()] == [lone] and edges == [] and not truncated
    assert dependencies.component("0" * 32, limit=10) == ({}, [], False)


def test_show_of_a_deep_chain_costs_a_few_queries():
    chain = _chain(DEPTH)
    with CaptureQueriesContext(connections[conf.database()]) as queries:
        info = workflows.show(Q, chain[DEPTH // 2])
    assert [s["id"] for s in info.steps] == chain  # dependency order
    assert len(queries) <= 8, [q["sql"][:100] for q in queries.captured_queries]
