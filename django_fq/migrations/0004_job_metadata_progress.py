"""Job metadata (a small JSON object and its tags) and the progress a running handler reports."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_fq", "0003_mysql_schema"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="metadata",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress_at",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress_message",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
        migrations.AddField(
            model_name="job",
            name="tags",
            field=models.CharField(blank=True, max_length=1100, null=True),
        ),
    ]
