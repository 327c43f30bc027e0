"""The DDL a store gives a migration (not a migration: the loader skips modules named ``_…``).

Migrations 0003, 0008 and 0011 ask the connection's store for vendor-specific DDL
(:meth:`~django_fq.storage.base.Store.schema_sql`,
:meth:`~django_fq.storage.base.Store.keys_schema_sql`,
:meth:`~django_fq.storage.base.Store.dependency_schema_sql`); on a backend
without a store (a site's other database) there is nothing to run.
"""

from django.db import migrations


def run(schema_editor, method: str, *, reverse: bool) -> None:
    """Execute the statements of the store's ``method`` (``reverse``: the ones that undo them)."""
    from django_fq import storage

    conn = schema_editor.connection
    store = storage.find(conn)
    for sql in [] if store is None else getattr(store, method)(conn, reverse=reverse):
        schema_editor.execute(sql, params=None)


def operation(method: str) -> migrations.RunPython:
    """A ``RunPython`` that runs the store's ``method`` forwards and backwards.

    Not atomic: MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
    """

    def forwards(apps, schema_editor):
        run(schema_editor, method, reverse=False)

    def backwards(apps, schema_editor):
        run(schema_editor, method, reverse=True)

    return migrations.RunPython(forwards, backwards, atomic=False, hints={"model_name": "job"})
