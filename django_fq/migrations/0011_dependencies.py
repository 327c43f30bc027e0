"""Dependencies between jobs: the edge table, the ``waiting`` state, and unique keys held while waiting.

``waiting`` (docs/reference/semantics.md §9 "Dependencies") is a stored state of its own,
so no claim reads a waiting job and the claim statements are unchanged. A waiting job
holds its unique key, as a queued or held one does (migration 0008): the partial
unique constraint names the four states, and on MariaDB/MySQL the generated column
that stands for it is rebuilt by the store's DDL (:meth:`django_fq.storage.base.Store.dependency_schema_sql`; empty on
PostgreSQL and SQLite, where the constraint itself changes).
"""

import django.db.models.deletion
from django.db import migrations, models

from django_fq import storage


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0010_rate_limit_snoozes"),
    ]

    operations = [
        migrations.CreateModel(
            name="Dependency",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("on_failure", models.CharField(default="cancel", max_length=6)),
                ("pending", models.BooleanField(default=True)),
            ],
            options={
                "db_table": "django_fq_dependency",
            },
        ),
        migrations.RemoveConstraint(
            model_name="job",
            name="fq_job_active_unique_key",
        ),
        migrations.AddField(
            model_name="job",
            name="has_dependents",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="job",
            name="waiting_on",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AlterField(
            model_name="job",
            name="state",
            field=models.CharField(
                choices=[
                    ("waiting", "Waiting"),
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("dead", "Dead"),
                    ("cancelled", "Cancelled"),
                    ("held", "Held"),
                ],
                default="queued",
                max_length=10,
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state__in", ["waiting", "queued", "running", "held"]), ("unique_key__isnull", False)),
                fields=("queue", "unique_key"),
                name="fq_job_active_unique_key",
            ),
        ),
        migrations.AddField(
            model_name="dependency",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="dependency_edges",
                to="django_fq.job",
            ),
        ),
        migrations.AddField(
            model_name="dependency",
            name="upstream",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="dependent_edges",
                to="django_fq.job",
            ),
        ),
        migrations.AddIndex(
            model_name="dependency",
            index=models.Index(fields=["upstream", "job"], name="fq_dep_upstream"),
        ),
        migrations.AddConstraint(
            model_name="dependency",
            constraint=models.UniqueConstraint(fields=("job", "upstream"), name="fq_dep_edge"),
        ),
        # Not atomic: MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
        migrations.RunPython(
            *storage.migration_ddl("dependency_schema_sql"), atomic=False, hints={"model_name": "job"}
        ),
    ]
