"""Pause and resume a queue: the flag every claim reads, and since when (docs/reference/semantics.md §9 "Pause")."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0005_payload_side_table"),
    ]

    operations = [
        migrations.AddField(
            model_name="queue",
            name="paused",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="paused_at",
            field=models.BigIntegerField(blank=True, help_text="epoch ms, database clock, of the pause", null=True),
        ),
    ]
