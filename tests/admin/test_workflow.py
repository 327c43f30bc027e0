"""The admin's workflow page: the SVG graph of a job's workflow, its table, bounds, escaping, permissions, cancel.

docs/admin.md "Workflow graph": every job connected to one job by
dependencies, drawn on the server as inline SVG (layered, each node a link
to its job), a table of the same steps, at most 500 steps drawn, and a
"cancel workflow" button for users who may change jobs.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_fq import conf
from django_fq import services as fq
from django_fq.models import Job
from django_fq.workflows import Workflow

from .helpers import changelist, claim_one, client_for, job_url, seq, text

pytestmark = pytest.mark.django_db

SVG = "{http://www.w3.org/2000/svg}"


class _Lazy:
    """``django_fq.admin.workflow``, imported once the admin is installed (its package registers on import)."""

    def __getattr__(self, name):
        from django_fq.admin import workflow as module

        return getattr(module, name)


workflow = _Lazy()


def wf_url(job_id: str, page: str = "workflow") -> str:
    return reverse(f"admin:django_fq_job_{page}", args=[seq(job_id)])


def graph_of(html: str) -> ET.Element:
    """The page's SVG graph, parsed as XML (so it is well-formed, with every name escaped)."""
    m = re.search(r'<svg class="fq-wf" id="fq-workflow-graph".*?</svg>', html, re.S)
    assert m, "no graph on the page"
    return ET.fromstring(m.group(0))


def nodes_of(svg: ET.Element) -> dict[str, dict]:
    """``{job id: {"state", "level", "href", "title", "texts"}}`` of the graph's nodes."""
    out = {}
    for a in svg.iter(f"{SVG}a"):
        out[a.get("data-job")] = {
            "state": a.get("data-state"),
            "level": int(a.get("data-level")),
            "href": a.get("href"),
            "class": a.get("class"),
            "title": a.find(f"{SVG}title").text,
            "texts": ["".join(t.itertext()) for t in a.iter(f"{SVG}text")],
        }
    return out


def edges_of(svg: ET.Element) -> set[tuple[str, str, str]]:
    """``{(upstream id, job id, policy)}`` of the graph's edges."""
    return {
        (p.get("data-from"), p.get("data-to"), p.get("data-policy"))
        for p in svg.iter(f"{SVG}path")
        if "fq-wf-edge" in (p.get("class") or "")
    }


def table_ids(html: str) -> list[str]:
    body = html.split('id="fq-workflow-steps"', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<tr data-job="([0-9a-f]{32})"', body)


def test_a_chain_is_drawn_in_order_with_each_state_and_a_link_per_job(root_client, queue):
    wf = Workflow()
    wf.chain(wf.step(queue, 1, name="fetch"), wf.step(queue, 2, name="parse"), wf.step(queue, 3, name="store"))
    ids = wf.enqueue()
    fq.ack(queue, claim_one(queue).receipt)  # fetch succeeded: parse is ready, store waits
    response = root_client.get(wf_url(ids["parse"]))
    assert response.status_code == 200
    html = text(response)
    nodes = nodes_of(graph_of(html))
    assert {n: (v["state"], v["level"]) for n, v in nodes.items()} == {
        ids["fetch"]: ("succeeded", 1),
        ids["parse"]: ("ready", 2),
        ids["store"]: ("waiting", 3),
    }
    for uid, node in nodes.items():
        assert node["href"] == job_url(uid)
        assert uid in node["title"] and node["state"] in node["title"]
        assert node["texts"][-1] == f"{node['state']} · {uid[:8]}"  # the state in words, not colour alone
    assert nodes[ids["fetch"]]["texts"][:2] == ["fetch", queue]
    assert edges_of(graph_of(html)) == {
        (ids["fetch"], ids["parse"], "cancel"),
        (ids["parse"], ids["store"], "cancel"),
    }
    # The table lists the same steps, level by level, with links.
    assert table_ids(html) == [ids["fetch"], ids["parse"], ids["store"]]
    for uid in ids.values():
        assert f'href="{job_url(uid)}"' in html.split('id="fq-workflow-steps"', 1)[1]
    assert 'id="fq-workflow-legend"' in html and "<script" not in html.split('id="fq-workflow-summary"', 1)[1]


def test_a_diamond_has_four_nodes_four_edges_three_levels(root_client, queue):
    wf = Workflow()
    top = wf.step(queue, "a", name="top")
    left = wf.step(queue, "b", name="left", after=[top])
    right = wf.step(queue, "c", name="right", after=[top], on_failure="wait")
    wf.step(queue, "d", name="bottom", after=[left, right], on_failure="run")
    ids = wf.enqueue()
    svg = graph_of(text(root_client.get(wf_url(ids["bottom"]))))
    nodes = nodes_of(svg)
    assert {uid: n["level"] for uid, n in nodes.items()} == {
        ids["top"]: 1,
        ids["left"]: 2,
        ids["right"]: 2,
        ids["bottom"]: 3,
    }
    assert {n["state"] for uid, n in nodes.items() if uid != ids["top"]} == {"waiting"}
    assert nodes[ids["top"]]["state"] == "ready"
    assert edges_of(svg) == {
        (ids["top"], ids["left"], "cancel"),
        (ids["top"], ids["right"], "wait"),
        (ids["left"], ids["bottom"], "run"),
        (ids["right"], ids["bottom"], "run"),
    }
    # Line style by policy: a class per policy, styled solid / dashed / dotted.
    classes = {p.get("data-policy"): p.get("class") for p in svg.iter(f"{SVG}path") if p.get("data-policy")}
    assert "fq-wf-edge-run" in classes["run"] and "fq-wf-edge-wait" in classes["wait"]


def test_fan_out_and_fan_in_with_states_after_failures(root_client, queue):
    fq.configure(queue, max_attempts=2)
    wf = Workflow()
    root = wf.step(queue, "root", name="root")
    chunks = wf.group(*(wf.step(queue, i, name=f"chunk-{i}", after=[root]) for i in range(10)))
    wf.callback(chunks, queue, "report", name="report")
    ids = wf.enqueue()
    fq.ack(queue, claim_one(queue).receipt)
    claimed = {j.id: j for j in fq.claim(queue, count=10)}
    assert set(claimed) == {ids[f"chunk-{i}"] for i in range(10)}
    fq.ack(queue, claimed[ids["chunk-0"]].receipt)
    fq.nack(queue, claimed[ids["chunk-1"]].receipt, error="boom", permanent=True)
    fq.nack(queue, claimed[ids["chunk-2"]].receipt, error="try again", delay_ms=3_600_000)
    fq.cancel(queue, ids["chunk-3"])
    svg = graph_of(text(root_client.get(wf_url(ids["root"]))))
    nodes = nodes_of(svg)
    assert len(nodes) == 12 and len(edges_of(svg)) == 20
    states = {uid: n["state"] for uid, n in nodes.items()}
    assert states[ids["root"]] == "succeeded"
    assert states[ids["chunk-0"]] == "succeeded"
    assert states[ids["chunk-1"]] == "dead"
    assert states[ids["chunk-2"]] == "retrying"  # queued again after a failed attempt
    assert states[ids["chunk-3"]] == "cancelled"
    assert {states[ids[f"chunk-{i}"]] for i in range(4, 10)} == {"running"}
    assert states[ids["report"]] == "waiting"
    assert {nodes[ids[f"chunk-{i}"]]["level"] for i in range(10)} == {2}
    assert nodes[ids["report"]]["level"] == 3
    # A settled edge (the root's, satisfied) is drawn fainter than a pending one.
    settled = [p for p in svg.iter(f"{SVG}path") if "fq-wf-settled" in (p.get("class") or "")]
    assert {p.get("data-from") for p in settled} >= {ids["root"]}


def test_layout_longest_path_levels_and_barycentre_order():
    # 1 -> 3, 2 -> 4 but 3 is listed after 4 in enqueue order below: 1, 2 | 4, 3 crosses once.
    edges = [(4, 1), (3, 2), (5, 4), (5, 3), (5, 1)]  # (job, upstream); 5 also depends on 1 directly
    columns = workflow.layout([1, 2, 3, 4, 5], edges)
    assert [sorted(c) for c in columns] == [[1, 2], [3, 4], [5]]  # 5 at its longest path, not after 1
    assert workflow.crossings(columns, edges) == 0
    assert workflow.crossings([[1, 2], [3, 4], [5]], edges) == 1  # the unswept order crosses


def test_the_bound_a_2000_step_workflow_shows_a_table_not_a_graph(root_client, queue):
    wf = Workflow()
    root = wf.step(queue, "root", name="root")
    for i in range(1999):
        wf.step(queue, i, name=f"leaf-{i}", after=[root])
    ids = wf.enqueue()
    with CaptureQueriesContext(connections[conf.database()]) as queries:
        response = root_client.get(wf_url(ids["root"]))
    assert response.status_code == 200
    html = text(response)
    assert 'id="fq-workflow-graph"' not in html
    assert 'id="fq-workflow-bound"' in html and f"more than {workflow.DRAW_LIMIT} steps" in html
    listed = table_ids(html)
    assert len(listed) == workflow.DRAW_LIMIT and listed[0] == ids["root"]
    assert len(queries) <= 25, [q["sql"][:120] for q in queries.captured_queries]
    assert len(response.content) < 400_000
    # A view of one leaf is bounded the same way.
    assert len(table_ids(text(root_client.get(wf_url(ids["leaf-1998"]))))) == workflow.DRAW_LIMIT


def test_a_deep_chain_past_the_bound_costs_a_few_queries_whatever_its_depth(root_client, queue):
    wf = Workflow()
    wf.chain(*(wf.step(queue, i, name=f"s{i}") for i in range(workflow.DRAW_LIMIT + 20)))
    ids = wf.enqueue()
    with CaptureQueriesContext(connections[conf.database()]) as queries:
        response = root_client.get(wf_url(ids["s0"]))
    assert response.status_code == 200 and 'id="fq-workflow-graph"' not in text(response)
    listed = table_ids(text(response))
    # The nearest steps are the ones read: s0 … s499 of the chain.
    assert sorted(listed) == sorted(ids[f"s{i}"] for i in range(workflow.DRAW_LIMIT))
    # The walk is one recursive statement (was one query per level: 500 here).
    assert len(queries) <= 25, [q["sql"][:120] for q in queries.captured_queries]


def test_step_names_are_escaped_and_cut(root_client, queue):
    hostile = "<script>alert('x')</script>"
    long_name = "n" * 190 + "-the-end"
    a = fq.enqueue(queue, "a", metadata={"step": hostile}).id
    b = fq.enqueue(queue, "b", metadata={"step": long_name}, depends_on=[a]).id
    c = fq.enqueue(queue, "c", metadata={"step": "x" * 3000, "tags": ["t"]}, depends_on=[b]).id
    response = root_client.get(wf_url(b))
    assert response.status_code == 200
    html = text(response)
    assert "<script>" not in html and "&lt;script&gt;" in html
    nodes = nodes_of(graph_of(html))  # parses: every name is escaped XML
    assert nodes[a]["texts"][0] == hostile[: workflow.NODE_CHARS - 1] + "…"
    assert nodes[a]["title"].startswith(f"step {hostile}")
    assert nodes[b]["texts"][0] == long_name[: workflow.NODE_CHARS - 1] + "…"
    assert nodes[c]["texts"][0] == "x" * (workflow.NODE_CHARS - 1) + "…"
    assert (
        nodes[c]["title"]
        == f"step {'x' * (workflow.NAME_CHARS - 1)}… · queue {queue} · job {c} · waiting · attempts 0 / 3"
    )
    names = re.findall(r'<td class="fq-wf-name">([^<]*)</td>', html)
    assert max(len(n) for n in names) <= 100
    # The builder records a step's name; the admin shows it.
    wf = Workflow()
    wf.step(queue, 1, name="<b>bold</b>", metadata={"tags": ["x"]})
    ids = wf.enqueue()
    assert fq.get(queue, ids["<b>bold</b>"]).metadata == {"step": "<b>bold</b>", "tags": ["x"]}


@pytest.mark.parametrize("object_id", ["abc", "99999999999999999999999", "9223372036854775807", "-1", "1%00"])
def test_a_bad_job_id_in_the_url_is_a_404(root_client, queue, object_id):
    fq.enqueue(queue, "a")
    url = reverse("admin:django_fq_job_changelist") + f"{object_id}/workflow/"
    assert root_client.get(url).status_code == 404
    assert root_client.get(url + "cancel/").status_code == 404


def test_a_job_whose_queue_is_gone_is_a_404_and_is_left_out_of_others(root_client, queue):
    a = fq.enqueue(queue, "a").id
    b = fq.enqueue(queue, "b", depends_on=[a]).id
    c = fq.enqueue(queue, "c", depends_on=[b]).id
    url = wf_url(c)
    Job.objects.filter(uid=c).update(queue_id=987_654_321)  # no such queue row (no database foreign key)
    assert root_client.get(url).status_code == 404
    nodes = nodes_of(graph_of(text(root_client.get(wf_url(a)))))
    assert set(nodes) == {a, b}


def test_links_from_the_job_page_and_the_job_list(root_client, queue):
    a = fq.enqueue(queue, "a").id
    b = fq.enqueue(queue, "b", depends_on=[a]).id
    alone = fq.enqueue(queue, "alone").id
    for uid in (a, b):
        assert f'href="{wf_url(uid)}"' in text(root_client.get(job_url(uid)))
    assert "fq-workflow-link" not in text(root_client.get(job_url(alone)))
    listing = text(root_client.get(changelist("job")))
    assert f'href="{wf_url(a)}"' in listing and f'href="{wf_url(b)}"' in listing
    assert f'href="{wf_url(alone)}"' not in listing


def test_view_only_users_see_the_graph_and_no_cancel(make_user, queue):
    a = fq.enqueue(queue, "a").id
    b = fq.enqueue(queue, "b", depends_on=[a]).id
    viewer = client_for(make_user("viewer", "view_job"))
    page = viewer.get(wf_url(b))
    assert page.status_code == 200 and 'id="fq-workflow-graph"' in text(page)
    assert 'id="fq-workflow-cancel"' not in text(page)
    assert viewer.get(wf_url(b, "workflow_cancel")).status_code == 403
    assert viewer.post(wf_url(b, "workflow_cancel")).status_code == 403
    assert fq.get(queue, b).state == "waiting"
    nobody = client_for(make_user("nobody", "view_queue"))
    assert nobody.get(wf_url(b)).status_code == 403


def test_cancel_asks_then_cancels_every_unfinished_step(make_user, queue):
    wf = Workflow()
    wf.chain(wf.step(queue, 1, name="a"), wf.step(queue, 2, name="b"), wf.step(queue, 3, name="c"))
    ids = wf.enqueue()
    fq.ack(queue, claim_one(queue).receipt)
    user = make_user("changer", "view_job", "change_job")
    page = text(client_for(user).get(wf_url(ids["b"])))
    assert f'href="{wf_url(ids["b"], "workflow_cancel")}"' in page
    # The confirm page does nothing; a POST without the CSRF token is refused.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    confirm = strict.get(wf_url(ids["b"], "workflow_cancel"))
    assert confirm.status_code == 200 and "csrfmiddlewaretoken" in text(confirm)
    assert "<strong>2</strong> of 3 steps" in text(confirm)
    assert fq.get(queue, ids["b"]).state == "ready"
    assert strict.post(wf_url(ids["b"], "workflow_cancel")).status_code == 403
    assert fq.get(queue, ids["b"]).state == "ready"
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', text(confirm)).group(1)
    done = strict.post(wf_url(ids["b"], "workflow_cancel"), {"csrfmiddlewaretoken": token, "post": "yes"}, follow=True)
    assert done.status_code == 200
    assert [fq.get(queue, ids[n]).state for n in "abc"] == ["succeeded", "cancelled", "cancelled"]
    assert any("2 unfinished jobs cancelled, 1 already finished" in str(m) for m in done.context["messages"])
    # Nothing left to cancel: no button.
    assert 'id="fq-workflow-cancel"' not in text(done)


def test_more_edges_than_the_bound_show_the_table_only(root_client, queue):
    ups = [r.id for r in fq.enqueue_many(queue, [{"payload": i} for i in range(100)])]
    n_down = workflow.EDGE_LIMIT // 100 + 1
    downs = [r.id for r in fq.enqueue_many(queue, [{"payload": i, "depends_on": ups} for i in range(n_down)])]
    response = root_client.get(wf_url(downs[0]))
    html = text(response)
    assert response.status_code == 200 and 'id="fq-workflow-graph"' not in html
    assert f"more than {workflow.EDGE_LIMIT} edges" in html
    assert len(table_ids(html)) == 100 + n_down
