"""Test-only faults for worker processes: dropped connections around the first settles.

Installed by :mod:`tests.worker_fault_settings` (a child process's
``DJANGO_SETTINGS_MODULE``), driven by ``FQ_TEST_WORKER_FAULTS``; the worker
itself knows nothing of it. ``ack_before=N``: the first N ack calls fail
before reaching the database; ``ack_after=N``: the first N ack calls commit,
then the reply is "lost" (the connection drops). ``nack_before`` /
``nack_after`` do the same to nacks. An ``ack_many`` batch counts as one ack
call.
"""

from __future__ import annotations

import functools
import os
import threading

from django.db import OperationalError, connections

#: Environment variable naming the faults to inject: ``op_when=N`` entries, comma-separated.
FAULTS_ENV = "FQ_TEST_WORKER_FAULTS"


def parse(text: str) -> dict[str, int]:
    """``"ack_before=1,nack_after=2"`` → ``{"ack_before": 1, "nack_after": 2}`` (a bare name counts 1)."""
    faults: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition("=")
        faults[name.strip()] = int(count or 1)
    return faults


class Faults:
    """Counts down the faults still to inject, shared by every thread of the process."""

    def __init__(self, faults: dict[str, int]):
        self.faults = dict(faults)
        self.lock = threading.Lock()

    def wrap(self, op: str, call):
        """``call`` (a ``django_fq.services`` settle function) with ``op``'s faults around it."""

        @functools.wraps(call)
        def faulty(*args, **kwargs):
            with self.lock:
                before = self.faults.get(f"{op}_before", 0)
                after = self.faults.get(f"{op}_after", 0)
                if before:
                    self.faults[f"{op}_before"] = before - 1
                elif after:
                    self.faults[f"{op}_after"] = after - 1
            if before:
                _drop()
                raise OperationalError(f"test fault: connection lost before the {op} reached the database")
            result = call(*args, **kwargs)
            if after:
                _drop()
                raise OperationalError(f"test fault: connection lost after the {op} committed")
            return result

        return faulty


def _drop() -> None:
    from django_fq import conf

    try:
        connections[conf.database()].close()
    except Exception:
        pass


def install() -> None:
    """Wrap ``services.ack``, ``ack_many`` and ``nack`` as ``FQ_TEST_WORKER_FAULTS`` says (nothing when unset)."""
    faults = parse(os.environ.get(FAULTS_ENV, ""))
    if not faults:
        return
    from django_fq import services

    injector = Faults(faults)
    for name, op in (("ack", "ack"), ("ack_many", "ack"), ("nack", "nack")):
        setattr(services, name, injector.wrap(op, getattr(services, name)))
