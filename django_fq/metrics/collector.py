"""The queue metrics, read from the database at each scrape (needs ``prometheus-client``).

:class:`QueueCollector` is a Prometheus custom collector: every ``collect()``
runs a few aggregate statements and turns them into metric families, so the
numbers are those of the database, right whatever the number of worker and
web processes. Durations are exported in seconds (the Prometheus convention)
although django-fq stores milliseconds.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from .. import conf, health, services
from ..models import QueueCounter
from ..types import STATE_NAMES, TIMING_NAMES, TOTAL_NAMES

#: The meaning of each ``fq_queue_<name>_total`` counter.
TOTAL_HELP = {
    "enqueued": "Jobs created by enqueue (duplicates coalesced by a token or unique key not counted).",
    "deduplicated": "Enqueues answered with an existing job (idempotency token or unique key).",
    "claimed": "Leases granted by claims.",
    "acked": "Jobs acked (succeeded).",
    "nacked": "Attempts failed by nack (retried later, or dead when out of attempts).",
    "released": "Leases given back by release (the attempt not counted).",
    "expired": "Leases that expired without a settle (handled as failed attempts).",
    "timed_out": "Running jobs failed because they passed their timeout_ms.",
    "retried": "Dead jobs made ready again by retry.",
    "cancelled": "Jobs cancelled.",
    "dead": "Jobs that became dead (attempts exhausted or permanent failure).",
}


class QueueCollector:
    """Collect the ``fq_queue_*`` metrics of every queue from the database.

    A handful of aggregate statements per scrape, whatever the number of
    queues: the queues with their policy and counts per state
    (:func:`django_fq.services.queues`), the counter shards summed per queue,
    and :func:`django_fq.health.queue_gauges` (expired leases not yet handled,
    the oldest ready job). A database error propagates to the caller (the
    view answers 503).
    """

    def collect(self):
        infos = services.queues()
        sums: dict[str, Any] = {
            row["queue__name"]: row
            for row in QueueCounter.objects.using(conf.database())
            .values("queue__name")
            .annotate(**{f"s_{n}": Sum(n) for n in TOTAL_NAMES + TIMING_NAMES})
            .order_by()
        }
        gauges = {h.queue: h for h in health.queue_gauges()}

        jobs = GaugeMetricFamily(
            "fq_queue_jobs", "Jobs of the queue in each reported state.", labels=["queue", "state"]
        )
        limit = GaugeMetricFamily(
            "fq_queue_concurrency_limit",
            "The queue's concurrency policy: most jobs running at once (0 = unlimited).",
            labels=["queue"],
        )
        ready_age = GaugeMetricFamily(
            "fq_queue_oldest_ready_age_seconds",
            "How long the oldest ready job has been eligible without being claimed (0 when none is ready).",
            labels=["queue"],
        )
        overdue = GaugeMetricFamily(
            "fq_queue_overdue_leases",
            "Leases past their deadline that no reaper or claim has handled yet (stays above 0 when no reaper runs).",
            labels=["queue"],
        )
        totals = {
            name: CounterMetricFamily(f"fq_queue_{name}", TOTAL_HELP[name], labels=["queue"]) for name in TOTAL_NAMES
        }
        wait = SummaryMetricFamily(
            "fq_queue_wait_seconds",
            "Wait of each claim: claim time - max(enqueued_at, run_at), summed over all claims.",
            labels=["queue"],
        )
        run = SummaryMetricFamily(
            "fq_queue_run_seconds", "Run time of each acked job: ack time - claim time.", labels=["queue"]
        )

        for info in infos:
            name = info.name
            for state in STATE_NAMES:
                jobs.add_metric([name, state], info.counts.get(state, 0))
            limit.add_metric([name], info.policy.concurrency)
            g = gauges.get(name)
            age = g.oldest_ready_age_ms if g is not None and g.oldest_ready_age_ms is not None else 0
            ready_age.add_metric([name], age / 1000)
            overdue.add_metric([name], g.stuck_leases if g is not None else 0)
            row = sums.get(name, {})
            for total in TOTAL_NAMES:
                totals[total].add_metric([name], int(row.get(f"s_{total}") or 0))
            wait.add_metric([name], int(row.get("s_wait_count") or 0), int(row.get("s_wait_ms_sum") or 0) / 1000)
            run.add_metric([name], int(row.get("s_run_count") or 0), int(row.get("s_run_ms_sum") or 0) / 1000)

        yield jobs
        yield limit
        yield ready_age
        yield overdue
        yield from totals.values()
        yield wait
        yield run
