"""The ``TASKS`` setting of the Tasks backend tests (in-process and in worker children).

No Django import here: ``tests/tasks/conftest.py`` installs it in the test
process and ``tests/tasks/worker_settings.py`` in ``fq_worker`` children.

* ``default`` — fq queues ``tk.default`` and ``tk.low`` (the prefix keeps them
  apart from the other tests' queues); backend-wide ``max_attempts`` 4; the
  task ``configured`` gets its options from ``OPTIONS["tasks"]``.
* ``oncommit`` — the same queue names under ``tkc.``, enqueued on commit.
"""

TEST_TASKS = {
    "default": {
        "BACKEND": "django_fq.tasks.FqBackend",
        "QUEUES": ["default", "low"],
        "OPTIONS": {
            "queue_prefix": "tk.",
            "max_attempts": 4,
            "tasks": {
                "tests.tasks.sample.configured": {"max_attempts": 2, "unique_key": "cfg-{0}", "timeout_ms": 60_000},
            },
        },
    },
    "oncommit": {
        "BACKEND": "django_fq.tasks.FqBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"queue_prefix": "tkc.", "enqueue_on_commit": True},
    },
}
