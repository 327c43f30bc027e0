"""Where a child process of ``fq_worker --pool processes`` starts (see :mod:`django_fq.worker.procpool`).

multiprocessing's ``spawn`` imports the child's entry point before anything
else runs in the fresh interpreter, and importing :mod:`django_fq.worker`
needs Django's app registry (it imports the models). So the entry point
lives here, outside that package: it sets Django up first, then hands over
to :func:`django_fq.worker.procpool.child_main`.
"""

from __future__ import annotations

from typing import Any


def main(conn: Any, soft: Any, spec: dict) -> None:
    """Run ``django.setup()``, then serve the worker's jobs (arguments as for ``child_main``)."""
    import django

    django.setup()
    from django_fq.worker.procpool import child_main

    child_main(conn, soft, spec)
