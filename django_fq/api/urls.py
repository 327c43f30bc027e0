"""URL patterns of the REST API; mount them with ``path("api/fq/", include("django_fq.api.urls"))``.

Names live in the ``fq_api`` namespace, e.g. ``reverse("fq_api:claim", args=["emails"])``.
Every path also answers without its trailing slash (see :func:`without_slash`).
"""

from __future__ import annotations

from django.urls import path

from . import views
from .schema import SchemaView

app_name = "fq_api"


def api_patterns() -> list:
    """Every endpoint except the schema itself (what the schema describes)."""
    return [
        path("queues/", views.QueueListView.as_view(), name="queues"),
        path("queues/<str:queue>/", views.QueueDetailView.as_view(), name="queue"),
        path("queues/<str:queue>/stats/", views.StatsView.as_view(), name="stats"),
        path("queues/<str:queue>/history/", views.HistoryView.as_view(), name="history"),
        path("queues/<str:queue>/pause/", views.QueuePauseView.as_view(), name="queue-pause"),
        path("queues/<str:queue>/resume/", views.QueueResumeView.as_view(), name="queue-resume"),
        path("queues/<str:queue>/jobs/", views.JobsView.as_view(), name="jobs"),
        path("queues/<str:queue>/jobs/bulk/", views.BulkEnqueueView.as_view(), name="enqueue-bulk"),
        path("queues/<str:queue>/jobs/<str:job_id>/", views.JobDetailView.as_view(), name="job"),
        path("queues/<str:queue>/jobs/<str:job_id>/retry/", views.JobRetryView.as_view(), name="job-retry"),
        path("queues/<str:queue>/jobs/<str:job_id>/cancel/", views.JobCancelView.as_view(), name="job-cancel"),
        path("queues/<str:queue>/jobs/<str:job_id>/wait/", views.JobWaitView.as_view(), name="job-wait"),
        path("queues/<str:queue>/jobs/<str:job_id>/workflow/", views.JobWorkflowView.as_view(), name="job-workflow"),
        path(
            "queues/<str:queue>/jobs/<str:job_id>/workflow/cancel/",
            views.JobWorkflowCancelView.as_view(),
            name="job-workflow-cancel",
        ),
        path("queues/<str:queue>/batches/", views.BatchesView.as_view(), name="batches"),
        path("queues/<str:queue>/batches/<str:batch_id>/", views.BatchDetailView.as_view(), name="batch"),
        path("queues/<str:queue>/batches/<str:batch_id>/jobs/", views.BatchMembersView.as_view(), name="batch-jobs"),
        path("queues/<str:queue>/batches/<str:batch_id>/seal/", views.BatchSealView.as_view(), name="batch-seal"),
        path("queues/<str:queue>/batches/<str:batch_id>/cancel/", views.BatchCancelView.as_view(), name="batch-cancel"),
        path("queues/<str:queue>/jobs/<str:job_id>/upstream/", views.JobUpstreamView.as_view(), name="job-upstream"),
        path("workflows/", views.WorkflowCreateView.as_view(), name="workflows"),
        path("workers/", views.WorkersView.as_view(), name="workers"),
        path("queues/<str:queue>/claim/", views.ClaimView.as_view(), name="claim"),
        path("queues/<str:queue>/ack/", views.AckView.as_view(), name="ack"),
        path("queues/<str:queue>/nack/", views.NackView.as_view(), name="nack"),
        path("queues/<str:queue>/release/", views.ReleaseView.as_view(), name="release"),
        path("queues/<str:queue>/extend/", views.ExtendView.as_view(), name="extend"),
        path("queues/<str:queue>/progress/", views.ProgressView.as_view(), name="progress"),
    ]


def without_slash(patterns: list) -> list:
    """The same routes without their trailing slash, so ``POST …/jobs`` works as ``POST …/jobs/`` does.

    Django's ``APPEND_SLASH`` cannot redirect a ``POST`` (with ``DEBUG`` it
    raises an error, a 500). These routes are unnamed, so ``reverse()`` keeps
    giving the documented slashed URLs, and built with ``schema=None``, so
    drf-spectacular leaves them out of any schema of the project.
    """
    out = []
    for pattern in patterns:
        view = pattern.callback
        out.append(path(str(pattern.pattern).removesuffix("/"), view.cls.as_view(**{**view.initkwargs, "schema": None})))
    return out


urlpatterns = [
    *api_patterns(),
    path("schema/", SchemaView.as_view(), name="schema"),
]
urlpatterns += without_slash(urlpatterns)
