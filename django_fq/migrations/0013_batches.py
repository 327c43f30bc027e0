"""Batches: the batch rows (state, counts, callback) and the memberships of jobs in them.

A member is flagged ``has_dependents`` (its batch's callback waits on it), so
the ack, dead and cancel paths that already settle a job's dependents count it
in its batch (docs/reference/semantics.md §9 "Batches"); no job column and no
job index is added, and the claim and one-statement ack are unchanged.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0012_key_rate_limit"),
    ]

    operations = [
        migrations.CreateModel(
            name="Batch",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("uid", models.CharField(max_length=32, verbose_name="id")),
                ("state", models.CharField(default="open", max_length=9)),
                ("total", models.BigIntegerField(default=0)),
                ("succeeded", models.BigIntegerField(default=0)),
                ("dead", models.BigIntegerField(default=0)),
                ("cancelled", models.BigIntegerField(default=0)),
                ("callback_queue", models.CharField(blank=True, max_length=200, null=True)),
                ("callback_payload", models.TextField(blank=True, null=True)),
                ("callback_options", models.TextField(blank=True, null=True)),
                ("callback_job", models.CharField(blank=True, max_length=32, null=True)),
                ("created_at", models.BigIntegerField(help_text="epoch ms, database clock")),
                ("sealed_at", models.BigIntegerField(blank=True, help_text="epoch ms, database clock", null=True)),
                ("finished_at", models.BigIntegerField(blank=True, help_text="epoch ms, database clock", null=True)),
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
            ],
            options={
                "db_table": "django_fq_batch",
            },
        ),
        migrations.CreateModel(
            name="BatchMember",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="django_fq.job",
                    ),
                ),
                (
                    "batch",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="django_fq.batch",
                    ),
                ),
            ],
            options={
                "db_table": "django_fq_batch_member",
            },
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(fields=["queue", "id"], name="fq_batch_queue"),
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(fields=["state", "finished_at"], name="fq_batch_finished"),
        ),
        migrations.AddConstraint(
            model_name="batch",
            constraint=models.UniqueConstraint(fields=("uid",), name="fq_batch_uid"),
        ),
        migrations.AddIndex(
            model_name="batchmember",
            index=models.Index(fields=["batch", "job"], name="fq_batch_member"),
        ),
    ]
