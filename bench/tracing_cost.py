"""What tracing (``FQ_TRACING``, django_fq.tracing) costs a worker per job, for docs/how-to/tracing.md.

Usage, from the repository root::

    FQ_TEST_DB=postgres FQ_TEST_PG_TEST_NAME=fq_bench_tracing python bench/tracing_cost.py [--jobs 5000] [--rounds 3]

Each round enqueues ``--jobs`` no-op jobs (one ``enqueue_many`` per 1000)
and drains them with an in-process burst :class:`~django_fq.worker.Worker`
(``--concurrency`` runner threads, default 64), three ways in turn:

* ``off``: no tracing subscriber (what ``FQ_TRACING = False`` runs);
* ``on, no SDK``: the subscriber with the API's no-op tracer (tracing on, no
  TracerProvider configured);
* ``on, SDK``: the subscriber with an SDK TracerProvider, a
  ``BatchSpanProcessor`` and an exporter that drops the spans (the
  production shape, minus the network).

It prints the drain rate of each (jobs/s, the median of the rounds), the
extra wall time per job against ``off`` and this process's CPU time per job
(µs; steadier than the rate on a shared machine). The test database is created and
destroyed by Django's test runner machinery (``FQ_TEST_PG_TEST_NAME``).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
sys.path.insert(0, ".")
django.setup()
from django.db import connection, connections  # noqa: E402 - after django.setup()
from django.test.utils import setup_test_environment  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402
from opentelemetry.trace import NoOpTracerProvider  # noqa: E402

from django_fq import services, wakeup  # noqa: E402
from django_fq.tracing import TracingSubscriber  # noqa: E402
from django_fq.worker import Worker  # noqa: E402

Q = "bench.tracing"


class Drop(SpanExporter):
    """Counts the spans it is given and drops them."""

    def __init__(self):
        self.spans = 0

    def export(self, spans):
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def drain(jobs: int, subscribers, concurrency: int) -> tuple[float, float]:
    """Enqueue ``jobs`` no-op jobs, drain them with a burst worker; return its rate (jobs/s) and CPU time per job (µs)."""
    for start in range(0, jobs, 1000):
        services.enqueue_many(Q, [{"payload": {"n": n}} for n in range(start, min(jobs, start + 1000))])
    worker = Worker(
        [Q],
        handlers={Q: lambda job: None},
        concurrency=concurrency,
        burst=True,
        poll_interval_ms=5,
        subscribers=subscribers,
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    stats = worker.run()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert stats.ok == jobs, stats
    return jobs / elapsed, cpu / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    # The per-job INFO lines (job.acked) cost the same either way and would drown the difference.
    logging.getLogger("django_fq").setLevel(logging.WARNING)
    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        drop = Drop()
        sdk = TracerProvider()
        sdk.add_span_processor(BatchSpanProcessor(drop, max_queue_size=65536))

        def traced(provider):
            subscriber = TracingSubscriber(tracer_provider=provider)
            return [(subscriber, *subscriber.event_types)]

        ways = {"off": list, "on, no SDK": lambda: traced(NoOpTracerProvider()), "on, SDK": lambda: traced(sdk)}
        drain(500, [], args.concurrency)  # warm up: connections, the queue row, the code
        rates: dict[str, list[float]] = {name: [] for name in ways}
        cpus: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, subscribers in ways.items():
                rate, cpu = drain(args.jobs, subscribers(), args.concurrency)
                rates[name].append(rate)
                cpus[name].append(cpu)
        sdk.force_flush()
        base = statistics.median(rates["off"])
        base_cpu = statistics.median(cpus["off"])
        print(
            f"{connection.vendor}, {args.jobs} no-op jobs x {args.rounds} rounds, {args.concurrency} runner threads "
            "(medians; CPU = this process's CPU time per job):"
        )
        for name, values in rates.items():
            rate, cpu = statistics.median(values), statistics.median(cpus[name])
            runs = ", ".join(f"{v:,.0f}" for v in values)
            print(
                f"  {name:11s} {rate:7,.0f} jobs/s ({runs})  wall {(1 / rate - 1 / base) * 1e6:+6.1f} µs/job, "
                f"CPU {cpu:6.1f} µs/job ({cpu - base_cpu:+5.1f})"
            )
        print(f"  spans exported by the SDK: {drop.spans:,}")
        sdk.shutdown()
    finally:
        connections.close_all()
        wakeup.shutdown_all()
        try:
            connection.creation.destroy_test_db(old_name, verbosity=0)
        except Exception as exc:  # noqa: BLE001 - the listener's session may linger a moment; the next run recreates it
            print(f"(test database not dropped: {exc})")


if __name__ == "__main__":
    main()
