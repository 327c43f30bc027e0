"""The queue metrics, read from the database at each scrape (needs ``prometheus-client``).

:class:`QueueCollector` is a Prometheus custom collector: every ``collect()``
runs a few aggregate statements and turns them into metric families, so the
numbers are those of the database, right whatever the number of worker and
web processes. Durations are exported in seconds (the Prometheus convention)
although django-fq stores milliseconds.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Count, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from .. import health, routing, services
from ..models import Batch, Queue, QueueCounter
from ..services.workers import WORKER_STATES
from ..types import STATE_NAMES, TIMING_NAMES, TOTAL_NAMES

#: Queues that get ``fq_queue_*`` series of their own unless ``FQ_METRICS_MAX_QUEUES`` says otherwise.
DEFAULT_MAX_QUEUES = 200
#: The ``queue`` label of the summed series of the other queues. Parentheses cannot occur in a
#: queue name, so it never clashes with a real queue (``_other`` is a valid name).
OTHER = "(other)"

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

#: Batch states (``django_fq.batches.STATES``): each gets a ``fq_queue_batches`` sample.
BATCH_STATES = ("open", "sealed", "finished", "cancelled")
#: The ``state`` labels of ``fq_queue_batch_members``: how the members of the batches still in
#: progress (open or sealed) stand; the four add up to their total.
BATCH_MEMBER_STATES = ("succeeded", "dead", "cancelled", "unfinished")


class QueueCollector:
    """Collect the ``fq_queue_*`` metrics of every queue from the database.

    With more than ``FQ_METRICS_MAX_QUEUES`` queues (default 200), the
    queues created first keep their own series and the others are summed
    under ``queue="(other)"`` (the oldest ready age is their maximum; no
    concurrency limit is exported for them), so a scrape stays bounded
    however many queues producers create. ``fq_queues`` and
    ``fq_queues_folded`` say how many exist and how many were folded.

    A handful of aggregate statements per scrape (per database alias with
    ``FQ_QUEUE_DATABASES``), whatever the number of queues: the queues with their policy and counts per state
    (:func:`django_fq.services.queues`), the counter shards summed per queue,
    :func:`django_fq.health.queue_gauges` (expired leases not yet handled,
    the oldest ready job), and the batches per queue and state with their
    member counts (:func:`batch_sums`), and the worker registry (:func:`worker_gauge`). A database error propagates to the
    caller (the view answers 503).
    """

    def collect(self):
        infos = services.queues()  # every alias's (FQ_QUEUE_DATABASES), merged by name
        sums: dict[str, Any] = {}
        gauges: dict[str, Any] = {}
        batch_rows: dict[str, dict[str, int]] = {}
        own_names: list[str] = []
        for alias in routing.visit():
            with routing.using(alias):
                sums.update(
                    (row["queue__name"], row)
                    for row in QueueCounter.objects.using(alias)
                    .values("queue__name")
                    .annotate(**{f"s_{n}": Sum(n) for n in TOTAL_NAMES + TIMING_NAMES})
                    .order_by()
                )
                gauges.update((h.queue, h) for h in health.queue_gauges())
                batch_rows.update(batch_sums(alias))
                # The first queues created keep their own series: a new queue never moves an old one into
                # OTHER (with several aliases: each alias's first, in alias order).
                own_names += Queue.objects.using(alias).order_by("id").values_list("name", flat=True)[: max_queues()]
        own = set(own_names[: max_queues()])

        jobs = GaugeMetricFamily(
            "fq_queue_jobs", "Jobs of the queue in each reported state.", labels=["queue", "state"]
        )
        limit = GaugeMetricFamily(
            "fq_queue_concurrency_limit",
            "The queue's concurrency policy: most jobs running at once (0 = unlimited).",
            labels=["queue"],
        )
        key_limit = GaugeMetricFamily(
            "fq_queue_key_concurrency_limit",
            "The queue's key_concurrency policy: most jobs of one concurrency key running at once (0 = unlimited).",
            labels=["queue"],
        )
        key_rate = GaugeMetricFamily(
            "fq_queue_key_rate_limit_per_second",
            "The queue's per-key rate limit: key_rate_limit claims of one concurrency key per rate_window_ms, "
            "as claims per second (0 = no per-key rate limit).",
            labels=["queue"],
        )
        rate = GaugeMetricFamily(
            "fq_queue_rate_limit_per_second",
            "The queue's rate limit: rate_limit claims per rate_window_ms, as claims per second (0 = no rate limit).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "fq_queue_paused",
            f'1 while the queue is paused (claims hand out no job), else 0; for queue="{OTHER}" the number of '
            "those queues that are paused.",
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
        batch_count = GaugeMetricFamily(
            "fq_queue_batches",
            "Batches of the queue in each state (open, sealed, finished, cancelled; finished and cancelled "
            "ones until prune deletes them). Only for queues that have batches.",
            labels=["queue", "state"],
        )
        batch_members = GaugeMetricFamily(
            "fq_queue_batch_members",
            "Members of the queue's batches still in progress (open or sealed), by outcome: succeeded, dead, "
            "cancelled, or unfinished; progress is 1 - unfinished / their sum. Only for queues that have batches.",
            labels=["queue", "state"],
        )
        queues = GaugeMetricFamily("fq_queues", "Queues that exist.")
        folded_queues = GaugeMetricFamily(
            "fq_queues_folded",
            f'Queues beyond FQ_METRICS_MAX_QUEUES whose fq_queue_* series are summed under queue="{OTHER}".',
        )

        folded = 0
        other: dict[str, float] = {}
        other_batches: dict[str, int] | None = None  # the folded queues' batch sums (None: none has batches)
        for info in infos:
            name = info.name
            g = gauges.get(name)
            age = g.oldest_ready_age_ms if g is not None and g.oldest_ready_age_ms is not None else 0
            row = sums.get(name, {})
            values = {
                **{f"jobs_{state}": info.counts.get(state, 0) for state in STATE_NAMES},
                "overdue": g.stuck_leases if g is not None else 0,
                **{f"total_{total}": int(row.get(f"s_{total}") or 0) for total in TOTAL_NAMES},
                **{n: int(row.get(f"s_{n}") or 0) for n in TIMING_NAMES},
                "paused": 1 if info.paused else 0,
            }
            batch_values = batch_rows.get(name)
            if name not in own:
                folded += 1
                for key, v in values.items():
                    other[key] = other.get(key, 0) + v
                other["age"] = max(other.get("age", 0), age)
                if batch_values is not None:
                    if other_batches is None:
                        other_batches = dict.fromkeys(batch_values, 0)
                    for key, n in batch_values.items():
                        other_batches[key] += n
                continue
            limit.add_metric([name], info.policy.concurrency)
            key_limit.add_metric([name], info.policy.key_concurrency)
            rate.add_metric([name], info.policy.rate_limit * 1000 / info.policy.rate_window_ms)
            key_rate.add_metric([name], info.policy.key_rate_limit * 1000 / info.policy.rate_window_ms)
            _add(jobs, ready_age, overdue, totals, wait, run, name, values, age)
            paused.add_metric([name], values["paused"])
            if batch_values is not None:
                _add_batches(batch_count, batch_members, name, batch_values)
        if folded:
            _add(jobs, ready_age, overdue, totals, wait, run, OTHER, other, other.get("age", 0))
            paused.add_metric([OTHER], other.get("paused", 0))
            if other_batches is not None:
                _add_batches(batch_count, batch_members, OTHER, other_batches)
        queues.add_metric([], len(infos))
        folded_queues.add_metric([], folded)

        yield jobs
        yield limit
        yield key_limit
        yield rate
        yield key_rate
        yield paused
        yield ready_age
        yield overdue
        yield from totals.values()
        yield wait
        yield run
        yield batch_count
        yield batch_members
        yield queues
        yield folded_queues
        yield worker_gauge()


def worker_gauge() -> GaugeMetricFamily:
    """``fq_workers{state}``: worker processes in the registry, live and gone (one query per database alias).

    A process serving queues on two database aliases has a row on each, so it
    counts once per alias (docs/admin.md "Workers").
    """
    family = GaugeMetricFamily(
        "fq_workers",
        "Worker processes in the registry: live, or gone (no heartbeat for 3 intervals; pruned an hour later).",
        labels=["state"],
    )
    counts = dict.fromkeys(WORKER_STATES, 0)
    for worker in services.workers():
        counts[worker.state] += 1
    for state, n in counts.items():
        family.add_metric([state], n)
    return family


def max_queues() -> int:
    """``FQ_METRICS_MAX_QUEUES``: how many queues get series of their own (default 200)."""
    value = getattr(settings, "FQ_METRICS_MAX_QUEUES", DEFAULT_MAX_QUEUES)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return DEFAULT_MAX_QUEUES  # the system check django_fq.E003 reports the bad value
    return value


def _add(jobs, ready_age, overdue, totals, wait, run, label: str, values: dict, age_ms: float) -> None:
    """Add one queue's samples (or the sums of the folded queues) under ``queue=label``."""
    for state in STATE_NAMES:
        jobs.add_metric([label, state], values[f"jobs_{state}"])
    ready_age.add_metric([label], age_ms / 1000)
    overdue.add_metric([label], values["overdue"])
    for total in TOTAL_NAMES:
        totals[total].add_metric([label], values[f"total_{total}"])
    wait.add_metric([label], values["wait_count"], values["wait_ms_sum"] / 1000)
    run.add_metric([label], values["run_count"], values["run_ms_sum"] / 1000)


def batch_sums(db_alias: str) -> dict[str, dict[str, int]]:
    """Per queue name with batches: ``{"batches_<state>": n, "members_<state>": n}`` (one aggregate statement).

    The members are counted over the batches still in progress (``open`` or
    ``sealed``) from the counts their rows keep (``total``, ``succeeded``,
    ``dead``, ``cancelled``), so no member row is read.
    """
    out: dict[str, dict[str, int]] = {}
    rows = (
        Batch.objects.using(db_alias)
        .values("queue__name", "state")
        .annotate(n=Count("id"), total=Sum("total"), ok=Sum("succeeded"), dead=Sum("dead"), gone=Sum("cancelled"))
        .order_by()
    )
    for row in rows:
        values = out.setdefault(
            row["queue__name"],
            {**{f"batches_{s}": 0 for s in BATCH_STATES}, **{f"members_{s}": 0 for s in BATCH_MEMBER_STATES}},
        )
        state = row["state"]
        if state in BATCH_STATES:
            values[f"batches_{state}"] += row["n"]
        if state in ("open", "sealed"):
            ok, dead, gone = int(row["ok"] or 0), int(row["dead"] or 0), int(row["gone"] or 0)
            values["members_succeeded"] += ok
            values["members_dead"] += dead
            values["members_cancelled"] += gone
            values["members_unfinished"] += max(0, int(row["total"] or 0) - ok - dead - gone)
    return out


def _add_batches(batch_count, batch_members, label: str, values: dict[str, int]) -> None:
    """Add one queue's batch samples (or the sums of the folded queues') under ``queue=label``."""
    for state in BATCH_STATES:
        batch_count.add_metric([label, state], values[f"batches_{state}"])
    for state in BATCH_MEMBER_STATES:
        batch_members.add_metric([label, state], values[f"members_{state}"])
