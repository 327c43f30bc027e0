"""Adversarial REST tests of flow control and workflows (issues 16 and 17): hostile bodies, other users' queues.

docs/rest-api.md: a permission class may limit a user to some queues; what a
user may not manage is never shown (a workflow lists only the jobs of queues
the user may manage), and ids of other queues' jobs are refused as missing.
"""

from __future__ import annotations

import pytest

from django_fq import services as fq

from .conftest import Client, make_user, url

pytestmark = pytest.mark.django_db


def _own_queues_only(settings, *capabilities: str):
    settings.FQ_API_PERMISSION_CLASSES = ["tests.api.auth.OwnQueuesOnly"]
    user = make_user(*capabilities)
    client = Client()
    client.force_authenticate(user)
    return client, user


def test_job_view_hides_edges_to_jobs_of_queues_the_user_may_not_manage(settings):
    """The job's page (and retry/cancel/wait answers) lists only dependencies and dependents the user may manage."""
    client, user = _own_queues_only(settings, "manage")
    mine = f"{user.username}:w"
    secret_up = fq.enqueue("someone-else:up", {"secret": 1}).id
    own = fq.enqueue(mine, 1, depends_on=[secret_up]).id
    own_up = fq.enqueue(mine, 2).id
    secret_down = fq.enqueue("someone-else:down", 3, depends_on=[own_up]).id
    shown = client.get(url("job", mine, own)).json()
    assert shown["state"] == "waiting"
    assert secret_up not in str(shown) and "someone-else" not in str(shown)
    shown_up = client.get(url("job", mine, own_up)).json()
    assert secret_down not in str(shown_up) and "someone-else" not in str(shown_up)
    waited = client.get(url("job-wait", mine, own_up), {"timeout_ms": 0}).json()
    assert secret_down not in str(waited)
    cancelled = client.post(url("job-cancel", mine, own_up)).json()
    assert secret_down not in str(cancelled) and "someone-else" not in str(cancelled)
    # The edges are there: only this user's view of them is cut.
    assert fq.get(mine, own).depends_on[0]["id"] == secret_up
    assert [e["id"] for e in fq.get(mine, own_up).dependents] == [secret_down]


def test_workflow_cancel_refusal_does_not_name_a_queue_the_user_may_not_see(settings):
    client, user = _own_queues_only(settings, "manage")
    mine = f"{user.username}:w"
    theirs = fq.enqueue("hidden-queue-name:w", 1).id
    own = fq.enqueue(mine, 2, depends_on=[theirs]).id
    r = client.post(url("job-workflow-cancel", mine, own))
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied")
    assert "hidden-queue-name" not in r.json()["message"]
    assert fq.get(mine, own).state == "waiting"
