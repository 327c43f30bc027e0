"""Worker registry (issue 19): a row per running worker process (:class:`django_fq.models.WorkerProcess`).

A new, small table: one row per worker process and database alias, written
at start, once per heartbeat interval and deleted at shutdown. Creating it
rewrites no existing row.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0014_results"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkerProcess",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "worker_id",
                    models.CharField(
                        help_text="as on the leases: hostname:pid:random by default",
                        max_length=200,
                        verbose_name="worker id",
                    ),
                ),
                ("host", models.CharField(max_length=255)),
                ("pid", models.BigIntegerField()),
                ("queues", models.TextField(help_text="the queue names served on this database, comma-separated")),
                ("concurrency", models.IntegerField()),
                ("running", models.IntegerField(default=0, help_text="jobs running at the last heartbeat")),
                ("pool", models.CharField(help_text="threads, asyncio, threads+asyncio or processes", max_length=40)),
                ("version", models.CharField(help_text="django_fq.__version__ of the worker", max_length=40)),
                ("started_at", models.BigIntegerField(help_text="epoch ms, database clock")),
                ("heartbeat_at", models.BigIntegerField(help_text="epoch ms, database clock")),
                ("heartbeat_ms", models.BigIntegerField(help_text="the worker's heartbeat interval, ms")),
            ],
            options={
                "verbose_name": "worker",
                "verbose_name_plural": "workers",
                "db_table": "django_fq_worker",
                "indexes": [models.Index(fields=["heartbeat_at"], name="fq_worker_heartbeat")],
                "constraints": [models.UniqueConstraint(fields=("worker_id",), name="fq_worker_id")],
            },
        ),
    ]
