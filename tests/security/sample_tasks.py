"""A ``@task`` function the security tests enqueue through their own ``FqBackend`` (never run)."""

from django_fq.tasks import task


@task
def echo(value, n):
    return value
