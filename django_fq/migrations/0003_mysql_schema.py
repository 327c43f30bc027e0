"""MariaDB / MySQL only: byte-wise key columns, the active-unique-key column, the claim and prune indexes.

The models' partial index and constraint do not exist on this backend (Django
drops the conditions), and its default collation compares text case- and
trailing-space-insensitively. The store of the connection gives the DDL
(:meth:`django_fq.storage.base.Store.schema_sql`); on PostgreSQL and SQLite
it is empty, and this migration changes nothing there. The model state is
unchanged, so ``makemigrations`` sees nothing to do on any backend.

For later migrations: an ``AlterField`` of one of the key columns
(``storage.mysql.BINARY_COLUMNS``) makes Django write ``MODIFY`` without a
collation, which gives the column its table's collation back (check
``django_fq.W031`` reports it); such a migration must set the binary
collation again on this backend. Django's ``fq_job_claim`` and
``fq_job_finished`` here are the definitions this migration gives them.
"""

from django.db import migrations

from django_fq import storage


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0002_job_uid_constraint_no_queue_fk"),
    ]

    operations = [
        # Not atomic: MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
        migrations.RunPython(*storage.migration_ddl("schema_sql"), atomic=False, hints={"model_name": "job"}),
    ]
