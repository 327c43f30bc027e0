"""Large payload bodies out of the job row: the side table ``django_fq_payload`` (docs/explanation/storage.md#large-payloads)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0004_job_metadata_progress"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobPayload",
            fields=[
                ("job_uid", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("body", models.TextField()),
            ],
            options={
                "db_table": "django_fq_payload",
            },
        ),
    ]
