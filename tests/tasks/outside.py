"""A ``@task`` in a module that is neither in an installed app nor in ``FQ_TASK_MODULES`` (C16 tests).

Importing it leaves a trace in ``IMPORTED``, so a test can tell whether a worker imported it.
"""

from django_fq.tasks import task

IMPORTED = True


@task
def probe(path):
    with open(path, "w") as f:
        f.write("ran")
