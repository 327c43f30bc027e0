"""The claim floor: where a queue's claims may start reading (docs/explanation/storage.md#the-claim-floor).

Created on every database; only a store with ``supports_claim_floor`` (PostgreSQL) writes rows.
A queue without a row is read whole, as before, so no row is needed for existing queues.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0006_queue_pause"),
    ]

    operations = [
        migrations.CreateModel(
            name="ClaimFloor",
            fields=[
                (
                    "queue",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="django_fq.queue",
                    ),
                ),
                ("priority", models.IntegerField(default=0)),
                ("seq", models.BigIntegerField(default=0)),
                ("lease_from", models.BigIntegerField(default=0)),
                ("pend_seq", models.BigIntegerField(blank=True, null=True)),
                ("pend_lease_from", models.BigIntegerField(blank=True, null=True)),
                ("pend_xmax", models.BigIntegerField(blank=True, null=True)),
            ],
            options={
                "db_table": "django_fq_claim_floor",
            },
        ),
    ]
