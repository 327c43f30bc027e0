"""Handlers of django-fq itself, imported by the worker's handler autodiscovery.

Registers the Django Tasks runner (:func:`django_fq.tasks.runner.run_task`)
for the queues of every ``TASKS`` alias whose backend is
:class:`django_fq.tasks.FqBackend`, so ``manage.py fq_worker`` runs ``@task``
functions with no further setup. Does nothing (and imports no Tasks
framework) when no such alias is configured.
"""

from django.conf import settings
from django.utils.module_loading import import_string


def _uses_fq_tasks() -> bool:
    for params in (getattr(settings, "TASKS", None) or {}).values():
        path = str((params or {}).get("BACKEND", ""))
        if path.startswith("django_fq."):
            return True
        try:
            if getattr(import_string(path), "is_fq_backend", False):
                return True
        except ImportError:
            continue
    return False


if _uses_fq_tasks():
    from django_fq.tasks.runner import register_configured

    register_configured()
