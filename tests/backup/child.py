"""The other database of the cross-database backup tests, in a child process.

``python -m tests.backup.child populate OUT`` migrates the database of the
settings in ``DJANGO_SETTINGS_MODULE``, fills it with :func:`scenario.populate`
and writes ``{"ids": …, "dump": …}`` to ``OUT``; ``dump OUT`` writes the dump
only. Exporting and importing are left to the real ``manage.py fq`` command.
"""

import json
import sys

import django


def main(argv):
    django.setup()
    from django.core.management import call_command

    from tests.backup import scenario

    op, out = argv
    if op == "populate":
        call_command("migrate", verbosity=0, interactive=False)
        ids = scenario.populate()
        for role in ("running", "succeeded"):
            ids.pop(f"{role}_receipt")  # capabilities: they have no business in a file
        data = {"ids": ids, "dump": scenario.dump()}
    elif op == "dump":
        data = {"dump": scenario.dump()}
    else:
        raise SystemExit(f"unknown op {op}")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(data, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
