"""Child process of the kill-mid-ack tests: ack a receipt and hang inside the ack's transaction.

``python -m tests.adversarial.hostile_ack_child QUEUE RECEIPT MARKER SQL_PREFIX``: the first
statement of the ack that starts with ``SQL_PREFIX`` (or, with a ``*`` before it, contains it) runs, then the child writes MARKER and
sleeps until the parent kills it (-9), so the ack's transaction never commits.
"""

from __future__ import annotations

import sys
import time

import django


def main() -> None:
    queue, receipt, marker, prefix = sys.argv[1:5]
    django.setup()
    from django.db import connection

    from django_fq import services

    def hook(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().startswith(prefix) or (prefix.startswith("*") and prefix[1:] in sql):
            with open(marker, "w") as f:
                f.write("in the ack\n")
            while True:
                time.sleep(1)
        return result

    with connection.execute_wrapper(hook):
        services.ack(queue, receipt)
    print("acked: the hook never ran", file=sys.stderr)
    sys.exit(3)


if __name__ == "__main__":
    main()
