"""Queue time to live: a policy field and the latest activity seen (docs/reference/semantics.md §9)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0008_concurrency_keys"),
    ]

    operations = [
        migrations.AddField(
            model_name="queue",
            name="ttl_ms",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="queue",
            name="active_at",
            field=models.BigIntegerField(blank=True, help_text="epoch ms, database clock", null=True),
        ),
    ]
