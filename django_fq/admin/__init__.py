"""Django admin pages of django-fq: inspect and repair queues and jobs.

Registered on the default admin site when ``django.contrib.admin`` is
installed (its autodiscovery imports this package):

* Queues — counts per state, totals, average wait/run time; the policy form
  calls ``services.configure``; deleting asks for confirmation and calls
  ``services.delete_queue``. The dashboard page hangs off this admin.
* Jobs — list, filters (queue, reported state), exact search (job id,
  idempotency token, unique key), the search form (:mod:`.search`), read-only
  detail; retry / requeue / cancel / delete finished jobs through the service
  verbs, on a selection or on every match of a search (:mod:`.bulk`). Never
  added or edited here.
* Batches — read only: state, a progress bar (done / total), counts, the
  callback job, and the member jobs with links (:mod:`django_fq.batches`).
* Leases and idempotency tokens — read only.
* Workers — read only: the worker registry, live and gone workers (:mod:`.workers`).

To register them on another ``AdminSite``, call :func:`register` with it.
See ``docs/admin.md``.
"""

from django.contrib import admin

from ..models import Batch, IdempotencyToken, Job, Lease, Queue, WorkerProcess
from .batches import BatchAdmin
from .jobs import JobAdmin
from .queues import QueueAdmin
from .records import IdempotencyTokenAdmin, LeaseAdmin
from .workers import WorkerAdmin

__all__ = ["BatchAdmin", "IdempotencyTokenAdmin", "JobAdmin", "LeaseAdmin", "QueueAdmin", "WorkerAdmin", "register"]


def register(site: admin.AdminSite) -> None:
    """Register django-fq's model admins on ``site``."""
    site.register(Queue, QueueAdmin)
    site.register(Job, JobAdmin)
    site.register(Batch, BatchAdmin)
    site.register(Lease, LeaseAdmin)
    site.register(IdempotencyToken, IdempotencyTokenAdmin)
    site.register(WorkerProcess, WorkerAdmin)


register(admin.site)
