"""Per-key concurrency (docs/reference/semantics.md §9 "Per-key limits").

The queue's ``key_concurrency``, the job's ``concurrency_key``, the stored state
``held`` (a job waiting for a slot of its key, outside the claim index), the
index of held jobs in claim order per key, and the key table
(``django_fq_key``: admitted jobs per key, and when a held one becomes due).
The active unique key now covers held jobs too. On MariaDB/MySQL the store
adds what migration 0003 did for the older columns: binary collations, the
active-unique-key column recomputed with ``held``, and the held index with
``state`` leading (:meth:`django_fq.storage.base.Store.keys_schema_sql`).
"""

from django.db import migrations, models

from django_fq import storage


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0007_claim_floor"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConcurrencyKey",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(db_column="concurrency_key", max_length=200)),
                ("admitted", models.IntegerField(default=0)),
                ("wake_at", models.BigIntegerField(blank=True, null=True)),
                (
                    "queue",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="+",
                        to="django_fq.queue",
                    ),
                ),
            ],
            options={
                "db_table": "django_fq_key",
                "indexes": [
                    models.Index(fields=["queue", "wake_at"], name="fq_key_wake")
                ],
                "constraints": [models.UniqueConstraint(fields=("queue", "key"), name="fq_key_unique")],
            },
        ),
        migrations.RemoveConstraint(
            model_name="job",
            name="fq_job_active_unique_key",
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="key_concurrency",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AlterField(
            model_name="job",
            name="state",
            field=models.CharField(
                choices=[
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
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state", "held")),
                fields=["queue", "concurrency_key", "-priority", "seq"],
                name="fq_job_key_held",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state__in", ["queued", "running", "held"]), ("unique_key__isnull", False)),
                fields=("queue", "unique_key"),
                name="fq_job_active_unique_key",
            ),
        ),
        # Not atomic: MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
        migrations.RunPython(*storage.migration_ddl("keys_schema_sql"), atomic=False, hints={"model_name": "job"}),
    ]
