"""Prometheus metrics of django-fq (optional: ``pip install 'django-fq[metrics]'``).

Two sources, documented in ``docs/operations/metrics.md``:

* :mod:`django_fq.metrics.views` — ``metrics_view``, an exporter view you
  mount in your URLconf. It reads every queue's numbers from the database at
  each scrape (``fq_queue_*``: jobs per state, totals, wait and run time
  sums, the oldest ready job, expired leases), so they are right however
  many processes do the work.
* :mod:`django_fq.metrics.worker` — what one ``fq_worker`` process does
  (``fq_worker_*``: handler outcomes, wait and run time histograms, threads
  busy, liveness), served by ``fq_worker --metrics-port N``.

Importing this package does not need ``prometheus-client``; the view answers
503 with an explanation when it is missing, and ``fq_worker --metrics-port``
refuses to start.
"""
