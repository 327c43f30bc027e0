"""The other database of the cross-database backup tests, in a child process.

``python -m tests.backup.child populate OUT`` migrates the database of the
settings in ``DJANGO_SETTINGS_MODULE``, fills it with :func:`scenario.populate`
and writes ``{"ids": …, "dump": …}`` to ``OUT``; ``dump OUT`` writes the dump
only. ``create`` makes a server's database (named by ``FQ_CHILD_DB_NAME``,
dropped first if it exists) and migrates it, exiting 3 when the server cannot
be reached; ``drop`` drops it (for SQLite both only migrate or do nothing: the
file is the test's). Exporting and importing are left to the real
``manage.py fq`` command.
"""

import json
import sys

import django


def main(argv):
    django.setup()
    from django.core.management import call_command
    from django.db import OperationalError, connection

    from django_fq import storage
    from tests.backup import scenario

    op, out = argv
    embedded = storage.for_connection(connection).embedded
    if op == "create":
        if embedded:
            call_command("migrate", verbosity=0, interactive=False)
            return
        try:
            with connection.creation._nodb_cursor():
                pass
        except OperationalError as exc:
            print(f"cannot connect: {exc}", file=sys.stderr)
            raise SystemExit(3) from None
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        return
    if op == "drop":
        if not embedded:
            connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)
        return
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
