"""Per-key rate limits (docs/reference/semantics.md §9 "Per-key limits").

Queue policy field ``key_rate_limit`` (0 = none; the window is the queue's
``rate_window_ms``); the per-key claim log ``django_fq_key_claim`` that the
claims of such a queue write; an index of the admitted (queued) keyed jobs of
a key, which each hold one of its rate tokens. On MariaDB/MySQL the store's DDL
makes the log's key column binary, as migration 0008 did for the key table, and
drops that index: there ``fq_job_key_held`` leads with (queue, state, key)
already (:meth:`django_fq.storage.base.Store.key_rate_schema_sql`).
"""

import django.db.models.deletion
from django.db import migrations, models

from django_fq import storage


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0011_dependencies"),
    ]

    operations = [
        migrations.CreateModel(
            name="KeyClaim",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(db_column="concurrency_key", max_length=200)),
                ("at", models.BigIntegerField(help_text="epoch ms, database clock, of the claim")),
            ],
            options={
                "db_table": "django_fq_key_claim",
            },
        ),
        migrations.AddField(
            model_name="queue",
            name="key_rate_limit",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state", "queued"), ("concurrency_key__isnull", False)),
                fields=["queue", "concurrency_key"],
                name="fq_job_key_queued",
            ),
        ),
        migrations.AddField(
            model_name="keyclaim",
            name="queue",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="django_fq.queue",
            ),
        ),
        migrations.AddIndex(
            model_name="keyclaim",
            index=models.Index(fields=["queue", "key", "at"], name="fq_key_claim_key"),
        ),
        migrations.AddIndex(
            model_name="keyclaim",
            index=models.Index(fields=["queue", "at"], name="fq_key_claim_at"),
        ),
        migrations.RunPython(
            *storage.migration_ddl("key_rate_schema_sql"), atomic=False, hints={"model_name": "keyclaim"}
        ),
    ]
