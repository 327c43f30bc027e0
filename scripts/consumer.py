#!/usr/bin/env python
"""A hand-written consumer of queue ``docs:native`` using django-fq's Python API.

It shows the three steps every consumer makes, without the worker:

1. ``claim`` jobs under a lease of 60 s (``visibility_ms=60000``). Until the
   lease's deadline nobody else can claim them; the claim hands back a
   *receipt* per job, the only thing that can settle it.
2. do the work (here: print the payload);
3. ``ack`` with the receipt. Acking the same receipt a second time is a
   harmless replay of the recorded outcome; any other stale receipt fails.

Run from the repository root: ``python scripts/consumer.py`` (uses the
example project's settings unless ``DJANGO_SETTINGS_MODULE`` is set).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

QUEUE = "docs:native"
VISIBILITY_MS = 60_000


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()

    from django_fq import services as fq

    jobs = fq.claim(QUEUE, count=10, visibility_ms=VISIBILITY_MS, worker="scripts/consumer.py")
    if not jobs:
        print(f"nothing to claim in {QUEUE}")
        return 0
    for job in jobs:
        print(
            f"claimed job {job.id} (attempt {job.attempts}/{job.max_attempts}, "
            f"lease until {job.deadline} ms): payload {json.dumps(job.payload)}"
        )
        outcome = fq.ack(QUEUE, job.receipt, result={"consumed_by": "scripts/consumer.py"})
        print(f"  ack -> state={outcome.state} replay={outcome.replay}")
        again = fq.ack(QUEUE, job.receipt, result={"consumed_by": "scripts/consumer.py"})
        print(f"  same ack repeated (e.g. after a lost reply) -> state={again.state} replay={again.replay}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
