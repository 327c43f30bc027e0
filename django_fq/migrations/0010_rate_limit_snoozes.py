"""Rate limits per queue and the snooze count of a job (docs/reference/semantics.md §9 "Rate limits").

Queue policy fields ``rate_limit`` (0 = none) and ``rate_window_ms``; the claim counter
(``django_fq_rate``) and claim log (``django_fq_rate_log``) that the claims of a rate-limited
queue keep; ``Job.snoozes``. Every column has a database default, so existing rows need no
rewrite by Django, and the same operations serve SQLite, PostgreSQL and MariaDB/MySQL.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0009_queue_ttl"),
    ]

    operations = [
        migrations.AddField(
            model_name="queue",
            name="rate_limit",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_window_ms",
            field=models.BigIntegerField(db_default=1000, default=1000),
        ),
        migrations.AddField(
            model_name="job",
            name="snoozes",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.CreateModel(
            name="QueueRate",
            fields=[
                (
                    "queue",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="django_fq.queue",
                    ),
                ),
                ("next_n", models.BigIntegerField(default=0)),
            ],
            options={"db_table": "django_fq_rate"},
        ),
        migrations.CreateModel(
            name="RateLog",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "queue", "n", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                (
                    "queue",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="django_fq.queue",
                    ),
                ),
                ("n", models.BigIntegerField()),
                ("at", models.BigIntegerField()),
            ],
            options={"db_table": "django_fq_rate_log"},
        ),
    ]
