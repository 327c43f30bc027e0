"""Per-minute history of each queue (docs/reference/history.md): one table, ``django_fq_minute``.

One row per queue and minute for the throughput (``kind`` 0) and one per
non-empty bin of the minute's wait-time (1) and run-time (2) histograms.
Written by one upsert per process and minute; pruned after
``FQ_HISTORY_RETENTION_MS`` through the ``minute`` index. A new table:
nothing existing is rewritten.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0015_workers"),
    ]

    operations = [
        migrations.CreateModel(
            name="QueueMinute",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("minute", models.BigIntegerField(help_text="start of the minute, epoch ms (database clock)")),
                ("kind", models.SmallIntegerField(default=0, help_text="0 throughput, 1 wait-time bin, 2 run-time bin")),
                ("bin", models.SmallIntegerField(default=0)),
                ("enqueued", models.IntegerField(db_default=0, default=0)),
                ("succeeded", models.IntegerField(db_default=0, default=0)),
                ("failed", models.IntegerField(db_default=0, default=0)),
                ("dead", models.IntegerField(db_default=0, default=0)),
                ("n", models.IntegerField(db_default=0, default=0, help_text="attempts in this histogram bin")),
                (
                    "queue",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="django_fq.queue",
                    ),
                ),
            ],
            options={
                "db_table": "django_fq_minute",
                "indexes": [models.Index(fields=["minute"], name="fq_minute_minute")],
                "constraints": [
                    models.UniqueConstraint(fields=("queue", "minute", "kind", "bin"), name="fq_minute_unique")
                ],
            },
        ),
    ]
