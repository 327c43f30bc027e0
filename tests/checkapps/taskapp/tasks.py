"""A ``@task`` of ``taskapp``."""

from django_fq.tasks import task


@task
def ping():
    return "pong"
