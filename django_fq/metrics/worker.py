"""Metrics of one worker process, served by ``fq_worker --metrics-port`` (needs ``prometheus-client``).

:class:`MetricsSubscriber` subscribes to the events of a
:class:`django_fq.worker.Worker` (:mod:`django_fq.worker.events`) and records
what this process does. The metrics live in prometheus-client's default registry, so
the worker's HTTP endpoint also shows the client's process metrics
(``process_*``, ``python_*``) and any metric your handlers register there.

Each process counts only its own work and starts at zero: add them up in
Prometheus (``sum by (queue) (rate(fq_worker_jobs_total[5m]))``). The numbers
of a whole queue, right across every process, come from the database through
the exporter view (``fq_queue_*``, :mod:`django_fq.metrics.views`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from ..worker import Worker, emit
from ..worker.events import JobFinished, JobsClaimed, JobStarted, WorkerStarted, WorkerStopped, WorkerStopping

#: Histogram buckets (seconds) of wait and run times: 5 ms to an hour.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

JOBS = Counter(
    "fq_worker_jobs",
    "Handler runs of this process by how the handler ended: ok (returned), failed (raised), "
    "permanent (raised PermanentFailure), lost (raised LeaseLost).",
    ["queue", "outcome"],
)
CLAIMED = Counter("fq_worker_claimed", "Jobs this process claimed.", ["queue"])
WAIT = Histogram(
    "fq_worker_wait_seconds",
    "Time from enqueue to the first claim of a job (database clock; includes a delay_ms/at the job was enqueued with).",
    ["queue"],
    buckets=BUCKETS,
)
RUN = Histogram("fq_worker_run_seconds", "Run time of the handler, whatever its outcome.", ["queue"], buckets=BUCKETS)
BUSY = Gauge("fq_worker_threads_busy", "Runner threads of this process running a handler now.")

_lock = threading.Lock()
_current: MetricsSubscriber | None = None
_installed = False


class MetricsSubscriber:
    """Records the ``fq_worker_*`` metrics of one worker from its events.

    Subscribe it to a worker (``Worker(..., subscribers=[MetricsSubscriber()])``);
    ``fq_worker --metrics-port`` does. Only one worker is reported at a time:
    the one whose run started last.
    """

    def __init__(self) -> None:
        self.worker: Worker | None = None
        #: True from the start of the run until a stop is requested or it returns (``fq_worker_up``).
        self.serving = False
        self.last_heartbeat: float | None = None  # wall-clock seconds (time.time())
        install()
        self._handlers: dict[type, Callable[[Any], None]] = {
            WorkerStarted: self._started,
            JobsClaimed: self._claimed,
            JobStarted: self._job_started,
            JobFinished: self._job_finished,
            WorkerStopping: self._stopping,
            WorkerStopped: self._stopping,
        }

    def __call__(self, event) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _started(self, event: WorkerStarted) -> None:
        global _current
        with _lock:
            _current = self
        self.worker = event.worker
        self.serving = True
        self.last_heartbeat = time.time()

    def _stopping(self, event) -> None:
        self.serving = False  # no more claims: fq_worker_up turns 0 at once

    def _claimed(self, event: JobsClaimed) -> None:
        # The database answered a claim: a sign of progress, even when it found nothing.
        self.last_heartbeat = time.time()
        if event.got:
            CLAIMED.labels(event.queue).inc(event.got)

    def _job_started(self, event: JobStarted) -> None:
        if event.job.attempts == 1:
            WAIT.labels(event.job.queue).observe(event.wait_ms / 1000)
        BUSY.inc()

    def _job_finished(self, event: JobFinished) -> None:
        BUSY.dec()
        RUN.labels(event.job.queue).observe(event.run_ms / 1000)
        JOBS.labels(event.job.queue, event.outcome).inc()
        self.last_heartbeat = time.time()


class MetricsWorker(Worker):
    """A :class:`~django_fq.worker.Worker` with a :class:`MetricsSubscriber` subscribed (kept for existing code)."""

    def __init__(self, *args, **kwargs):
        self.metrics = MetricsSubscriber()
        kwargs["subscribers"] = [*kwargs.get("subscribers", ()), self.metrics]
        super().__init__(*args, **kwargs)


class WorkerCollector:
    """The per-process gauges read at scrape time from the worker the current :class:`MetricsSubscriber` follows."""

    NAMES = (
        "fq_worker_up",
        "fq_worker_info",
        "fq_worker_threads",
        "fq_worker_jobs_in_hand",
        "fq_worker_last_heartbeat_timestamp_seconds",
        "fq_worker_settles_total",
    )

    def describe(self):
        """The families this collector yields (so the registry reserves their names)."""
        for name in self.NAMES:
            yield GaugeMetricFamily(name, "")

    def collect(self):
        subscriber = _current
        worker = subscriber.worker if subscriber is not None else None
        up = GaugeMetricFamily(
            "fq_worker_up",
            "1 while this process's worker claims jobs; 0 before it starts and once it stops (draining included).",
        )
        up.add_metric([], 1 if subscriber is not None and subscriber.serving else 0)
        yield up
        if subscriber is None or worker is None:
            return
        info = InfoMetricFamily("fq_worker", "The worker of this process.")
        info.add_metric([], {"worker": worker.worker_id, "queues": ",".join(worker.queues)})
        yield info
        threads = GaugeMetricFamily("fq_worker_threads", "Runner threads of this process (--concurrency).")
        threads.add_metric([], worker.concurrency)
        yield threads
        in_hand = GaugeMetricFamily(
            "fq_worker_jobs_in_hand", "Jobs this process holds a lease on: running, or claimed ahead (--prefetch)."
        )
        in_hand.add_metric([], worker.running_count)
        yield in_hand
        beat = GaugeMetricFamily(
            "fq_worker_last_heartbeat_timestamp_seconds",
            "Unix time of this worker's last sign of progress: a claim call the database answered, or a handler that ended.",
        )
        beat.add_metric([], subscriber.last_heartbeat or 0)
        yield beat
        stats = worker.stats
        settled = CounterMetricFamily(
            "fq_worker_settles",
            "How this process settled its jobs: acked, nacked, not_settled (the lease was gone or the job "
            "cancelled when the handler ended), released (given back at shutdown).",
            labels=["result"],
        )
        for result, value in (
            ("acked", stats.ok),
            ("nacked", stats.failed),
            ("not_settled", stats.settle_errors),
            ("released", stats.released),
        ):
            settled.add_metric([result], value)
        yield settled


def install() -> None:
    """Register :class:`WorkerCollector` in the default registry (once per process)."""
    global _installed
    with _lock:
        if not _installed:
            REGISTRY.register(WorkerCollector())
            _installed = True


def serve(port: int, addr: str = "127.0.0.1"):
    """Serve the default registry over HTTP on ``addr:port`` from a daemon thread; return the server.

    ``port`` 0 picks a free port (read it from ``server.server_port``). The
    address is logged as the ``worker.metrics`` event. Raises ``OSError``
    when the address cannot be bound.
    """
    from prometheus_client import start_http_server

    install()
    server, _thread = start_http_server(port, addr=addr)
    emit(logging.INFO, "worker.metrics", addr=addr, port=server.server_port, path="/metrics")
    return server


def check_port(port: int, addr: str = "127.0.0.1") -> None:
    """Bind ``addr:port`` for a moment, as :func:`serve` would, and let it go again.

    ``port`` is a TCP port (1 – 65535), ``addr`` a host name or an IPv4/IPv6
    address of this host. Lets the ``--processes`` supervisor refuse a taken
    port before it starts any worker; the port can still be taken between
    this check and the real bind, so :func:`serve` stays the one that
    decides. Raises ``OSError`` (``socket.gaierror`` for an unknown host
    name) when the address cannot be bound.
    """
    # The family the way prometheus-client's server picks it; SO_REUSEADDR as http.server sets it.
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
