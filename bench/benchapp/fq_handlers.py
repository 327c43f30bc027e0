"""Handlers found by the worker's autodiscovery when it runs with ``bench.settings``."""

from django_fq.handlers import handler

#: The queue every drain and latency measurement uses.
QUEUE = "bench"


@handler(QUEUE)
def noop(job):
    """Do nothing: the benchmark measures the queue, not the work."""
    return None
