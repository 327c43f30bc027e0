"""Handlers found by the worker's autodiscovery when it runs with ``bench.settings``."""

import os
import time

from django_fq.handlers import handler

#: The queue every drain and latency measurement uses.
QUEUE = "bench"


@handler(QUEUE)
def noop(job):
    """Do nothing: the benchmark measures the queue, not the work."""
    return None


#: The queue of the batch drain (``--phases batch``): the same no-op, ``FQ_BENCH_BATCH`` jobs per call.
BATCH_QUEUE = "bench.batch"


@handler(BATCH_QUEUE, batch=int(os.environ.get("FQ_BENCH_BATCH", "500")))
def noop_batch(jobs):
    """Do nothing with a whole batch: every job is acked (docs/how-to/batch-handlers.md)."""
    return None


#: The queue of bench/workflows.py's latency phase: the handler's start instant is its result.
STAMP_QUEUE = "bench.stamp"


@handler(STAMP_QUEUE)
def stamp(job):
    """Return ``{"t": time.time()}`` read first thing: when the handler started (epoch s, this host's clock)."""
    return {"t": time.time()}
