"""Fault and load scenarios against real ``fq_worker`` processes, and the invariants they must keep.

* :mod:`tests.chaos.invariants` — the audit (triggers on django-fq's tables,
  the run table the handlers write) and the checker every scenario ends with.
* :mod:`tests.chaos.scenarios` — kill storm, database restart, network
  partition, stress, SQLite with a busy writer; each bounded in time.
* :mod:`tests.chaos.run` — ``python -m tests.chaos.run --scenario NAME``
  (``make chaos``) on a fresh database.
* ``test_chaos.py`` — the same scenarios at CI size (slow tier);
  ``test_invariants.py`` — the checker catches what it claims to catch (fast tier).

This package is also a tiny Django app (``tests.chaos.settings`` installs it)
so worker processes find the handlers in :mod:`tests.chaos.fq_handlers`.
"""
