"""Handlers of the middleware worker tests (``tests.middleware.worker_settings`` registers them)."""

from __future__ import annotations

import json
import os

from . import mw


def record(job):
    path = job.payload.get("trail")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(
                json.dumps(
                    {
                        "mw": "handler",
                        "id": job.id,
                        "attempt": job.attempts,
                        "pid": os.getpid(),
                        "metadata": job.metadata,
                    }
                )
                + "\n"
            )
    mw.TRAIL.append(("handler", job.id))
    if job.payload.get("fail_first") and job.attempts == 1:
        raise ValueError("first attempt fails")
    return {"metadata": job.metadata}
