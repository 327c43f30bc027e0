"""A handler module that reads the database when imported (a common pattern: a cached lookup)."""

from django_fq import handler
from django_fq.models import Queue

KNOWN = set(Queue.objects.values_list("name", flat=True))  # touches the DB at import


@handler("chk.db")
def run(job):
    return None
